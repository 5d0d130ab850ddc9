"""Watch other ranks' heartbeats: a rank is lost when it beats FAILED, or when no beat has come
for `stale_after` intervals (killed, frozen, or cut off)."""

from __future__ import annotations

import asyncio
import time

import zmq
import zmq.asyncio

from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.state import ExitCode
from aioworker.wire.health import STALE_AFTER_INTERVALS, RankState
from aioworker.wire.protocol import HEARTBEAT_DECODER, ProtocolError


class LivenessWatch:
    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        ranks: set[int],
        interval_s: float,
        first_beat_grace_s: float,
    ) -> None:
        self.sock = sock
        self.interval_s = interval_s
        started = time.monotonic()
        # Until a rank's first beat, allow for its process to start.
        self.deadlines = {rank: started + first_beat_grace_s for rank in ranks}
        self.states: dict[int, str] = {}

    async def run(self) -> None:
        """Returns never; raises FatalError(PEER_LOST) when a watched rank is lost."""
        receiver = asyncio.ensure_future(self._receive())
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                if receiver.done():
                    receiver.result()
                self.check(time.monotonic())
        finally:
            receiver.cancel()

    def expect_beats_now(self, rank: int) -> None:
        """`rank` is known to be up (it said so on another socket): end its start-up grace, so a
        rank lost before its first beat reached us is still noticed within 3 intervals."""
        fresh = time.monotonic() + STALE_AFTER_INTERVALS * self.interval_s
        self.deadlines[rank] = min(self.deadlines[rank], fresh) if rank in self.states else fresh

    def check(self, now: float) -> None:
        for rank, deadline in self.deadlines.items():
            if self.states.get(rank) == RankState.FAILED:
                raise FatalError(ExitCode.PEER_LOST, f"rank {rank} reported FAILED")
            if now > deadline:
                raise FatalError(
                    ExitCode.PEER_LOST,
                    f"rank {rank} sent no heartbeat for {STALE_AFTER_INTERVALS} intervals "
                    f"({STALE_AFTER_INTERVALS * self.interval_s:.1f}s): killed, frozen or unreachable",
                )

    async def _receive(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            try:
                beat = HEARTBEAT_DECODER.decode(frames)
            except ProtocolError:
                continue
            if beat.rank in self.deadlines:
                self.deadlines[beat.rank] = (
                    time.monotonic() + STALE_AFTER_INTERVALS * beat.interval_s
                )
                self.states[beat.rank] = beat.state


def watch_socket(context: zmq.asyncio.Context, endpoints: list[str]) -> zmq.asyncio.Socket:
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    for endpoint in endpoints:
        sock.connect(endpoint)
    return sock
