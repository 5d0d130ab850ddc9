"""Watch other ranks' heartbeats: a rank is lost when it beats FAILED, or when no beat has come
for as long as its last beat allows (killed, frozen, or cut off): health.stale_after_s."""

from __future__ import annotations

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.state import ExitCode
from aioworker.wire.drops import DropCounter
from aioworker.wire.health import STALE_AFTER_INTERVALS, RankState, stale_after_s
from aioworker.wire.protocol import HEARTBEAT_DECODER, Heartbeat, ProtocolError

log = logging.getLogger(__name__)

# The options of a heartbeat SUB socket: every beat.
SUBSCRIBE_ALL = {zmq.SUBSCRIBE: b""}


class LivenessWatch:
    """Deadlines per watched rank, pushed back by each beat. Checked every quarter interval, after
    reading every beat that has arrived, so a loop that was held up does not mistake beats it has
    not read yet for silence, and a lost rank is noticed within a quarter interval of its
    deadline."""

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        ranks: set[int],
        interval_s: float,
        first_beat_grace_s: float,
        malformed: DropCounter | None = None,
    ) -> None:
        # The same socket, read without waiting: beats are drained before each check.
        self.sock = zmq.Socket.shadow(sock.underlying)
        self.interval_s = interval_s
        self.malformed = malformed or DropCounter(log, "malformed heartbeats")
        started = time.monotonic()
        # Until a rank's first beat, allow for its process to start.
        self.deadlines = {rank: started + first_beat_grace_s for rank in ranks}
        # How long each rank may be silent, as its last beat allows (the grace until one).
        self.allowances = dict.fromkeys(ranks, first_beat_grace_s)
        self.states: dict[int, str] = {}
        # Each watched rank's latest beat (its expert load is read from there).
        self.last_beats: dict[int, Heartbeat] = {}

    async def run(self) -> None:
        """Returns never; raises FatalError(PEER_LOST) when a watched rank is lost."""
        while True:
            await asyncio.sleep(self.interval_s / 4)
            self.read_beats()
            self.check(time.monotonic())

    def expect_beats_now(self, rank: int) -> None:
        """`rank` is known to be up (it said so on another socket): end its start-up grace, so a
        rank lost before its first beat reached us is still noticed within 3 intervals. A rank
        that has beaten keeps the deadline its last beat set."""
        if rank in self.states:
            return
        self.allowances[rank] = STALE_AFTER_INTERVALS * self.interval_s
        self.deadlines[rank] = time.monotonic() + self.allowances[rank]

    def check(self, now: float) -> None:
        for rank, deadline in self.deadlines.items():
            if self.states.get(rank) == RankState.FAILED:
                raise FatalError(ExitCode.PEER_LOST, f"rank {rank} reported FAILED")
            if now > deadline:
                raise FatalError(
                    ExitCode.PEER_LOST,
                    f"rank {rank} sent no heartbeat for {self.allowances[rank]:.1f}s "
                    f"({self.states.get(rank, 'before its first beat')}): killed, frozen or "
                    "unreachable",
                )

    def read_beats(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                beat = HEARTBEAT_DECODER.decode(frames)
            except ProtocolError as exc:
                self.malformed.count(str(exc))
                continue
            if beat.rank in self.deadlines:
                self.allowances[beat.rank] = stale_after_s(beat)
                self.deadlines[beat.rank] = time.monotonic() + self.allowances[beat.rank]
                self.states[beat.rank] = beat.state
                self.last_beats[beat.rank] = beat
