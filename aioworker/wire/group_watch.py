"""A client's watch over the groups it sends to: each group's driver heartbeat, read from its
PUB socket. A group silent for as long as its last beat allows (health.stale_after_s), or that
never beat within the first-beat allowance, is lost, and the client ends its open requests with
an error instead of waiting for outputs that will not come."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from aioworker.wire.drops import DropCounter
from aioworker.wire.health import MISSING, STALE, RankState, stale_after_s
from aioworker.wire.protocol import HEARTBEAT_DECODER, Heartbeat, ProtocolError
from aioworker.wire.security import ClientSecurity
from aioworker.wire.transport import make_socket

log = logging.getLogger(__name__)

# How often a heartbeat socket whose driver is gone tries to connect again (a failed connect is
# one cheap system call).
RECONNECT_MS = 20


class GroupWatch:
    def __init__(
        self,
        context: zmq.asyncio.Context,
        heartbeat_endpoints: list[str],
        security: ClientSecurity,
        first_beat_timeout_s: float,
        on_lost: Callable[[int, str], None],
        interval_s: float = 1.0,
    ) -> None:
        """`interval_s`: the beat interval expected until a group's first beat says its own."""
        self.sockets = [
            make_socket(
                context,
                zmq.SUB,
                connect=endpoint,
                options={
                    zmq.SUBSCRIBE: b"",
                    # A restarted driver is heard within this many ms of binding (it beats
                    # to each new subscriber at once), instead of ZeroMQ's default 100.
                    zmq.RECONNECT_IVL: RECONNECT_MS,
                    **security.connect_options(endpoint),
                },
                max_message_bytes=1 << 20,
            )
            for endpoint in heartbeat_endpoints
        ]
        # The same sockets, read without waiting: beats are drained before each check.
        self._readers = [zmq.Socket.shadow(sock.underlying) for sock in self.sockets]
        self.on_lost = on_lost
        started = time.monotonic()
        self.deadlines = [started + first_beat_timeout_s] * len(heartbeat_endpoints)
        self.intervals = [interval_s] * len(heartbeat_endpoints)
        # How long each group may be silent, as its last beat allows.
        self.allowances = [first_beat_timeout_s] * len(heartbeat_endpoints)
        self.is_lost = [False] * len(heartbeat_endpoints)
        # Each group's state as its driver last published it; MISSING before its first beat.
        self.states: list[str] = [MISSING] * len(heartbeat_endpoints)
        # Each group's latest driver heartbeat (None before the first): what metrics read.
        self.beats: list[Heartbeat | None] = [None] * len(heartbeat_endpoints)
        # Each group's max_model_len from its driver's beats; 0 until one says it.
        self.max_model_lens = [0] * len(heartbeat_endpoints)
        # Each group's driver process, from its beats: another pid means the group restarted.
        self.driver_pids = [0] * len(heartbeat_endpoints)
        self.malformed = DropCounter(log, "malformed heartbeats")

    async def run(self) -> None:
        # Awaiting the sockets, not only sleeping: a SUB socket sends its subscription again
        # after a reconnect only when its own thread (this loop) handles its events, and until
        # then a restarted driver's beats go nowhere.
        poller = zmq.asyncio.Poller()
        for sock in self.sockets:
            poller.register(sock, zmq.POLLIN)
        while True:
            await poller.poll(1000 * min(self.intervals) / 4)
            now = time.monotonic()
            for group, reader in enumerate(self._readers):
                self._read_beats(group, reader, now)
                self._check(group, now)

    def refresh(self) -> None:
        """Read every beat that has arrived, now: a rank beats at once when its state changes,
        so a decision taken after this sees the state an admin command has just reported."""
        now = time.monotonic()
        for group, reader in enumerate(self._readers):
            self._read_beats(group, reader, now)

    def awaiting_first_beat(self) -> bool:
        """Whether some group has not beaten yet and is still within its first-beat allowance
        (after refreshing: every beat that has arrived counts; one past its allowance is lost
        here, as the watch's next check would find it)."""
        self.refresh()
        now = time.monotonic()
        for group in range(len(self.states)):
            self._check(group, now)
        return any(
            state == MISSING and not lost and now <= deadline
            for state, lost, deadline in zip(self.states, self.is_lost, self.deadlines, strict=True)
        )

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)

    def _read_beats(self, group: int, sock: zmq.Socket, now: float) -> None:
        # Asking the socket first, rather than trying a read: a client refreshes before every
        # submission, nearly always finds nothing, and a read that raises zmq.Again cost twice
        # as much (4.1 against 2.4 us, about a tenth of the burst rate of `bench control`).
        while sock.get(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                beat = HEARTBEAT_DECODER.decode(frames)
            except ProtocolError as exc:
                self.malformed.count(f"group {group}: {exc}")
                continue
            if beat.rank != 0:
                continue
            if self.driver_pids[group] not in (0, beat.pid):
                # Restarted before it was missed for long enough to be lost: what was sent to
                # the process that died will never be answered, so it ends here.
                self._lose(group, f"group {group} restarted (driver pid {beat.pid})")
            self.driver_pids[group] = beat.pid
            self.intervals[group] = beat.interval_s
            self.states[group] = beat.state
            self.beats[group] = beat
            self.max_model_lens[group] = beat.max_model_len or self.max_model_lens[group]
            if beat.state == RankState.FAILED:
                self._lose(group, f"group {group} failed: {beat.detail}")
                continue
            self.allowances[group] = stale_after_s(beat)
            self.deadlines[group] = now + self.allowances[group]
            self.is_lost[group] = False

    def _check(self, group: int, now: float) -> None:
        if not self.is_lost[group] and now > self.deadlines[group]:
            silent = self.allowances[group]
            self._lose(group, f"group {group} is lost: no heartbeat for {silent:.1f}s")

    def status(self, group: int) -> str:
        """The group's published state, or STALE once it is lost to silence (MISSING while it
        has never beaten, lost or not)."""
        if self.is_lost[group] and self.states[group] not in (RankState.FAILED, MISSING):
            return STALE
        return self.states[group]

    def _lose(self, group: int, reason: str) -> None:
        if not self.is_lost[group]:
            self.is_lost[group] = True
            log.warning("%s; ending its requests", reason)
        self.on_lost(group, reason)
