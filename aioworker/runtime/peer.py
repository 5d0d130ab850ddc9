"""Ranks 1..N-1 of a group: run every numbered plan the driver publishes, in order, on their
shard. A missing plan number means this rank's state has diverged: it reports and exits."""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import zmq

from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.drops import DropCounter
from aioworker.runtime.hung import watch_for_hung_steps
from aioworker.runtime.liveness import LivenessWatch, watch_socket
from aioworker.runtime.rank import FatalError, RankProgram
from aioworker.runtime.state import ExitCode, RankState
from aioworker.wire.protocol import (
    CONTROL_DECODER,
    PeerFailed,
    PeerReady,
    PlanMessage,
    ProtocolError,
    Shutdown,
    WeightsAck,
    WeightsStatus,
    encode,
)

log = logging.getLogger(__name__)


class Peer(RankProgram):
    def bind_sockets(self) -> None:
        self.control = self.socket(zmq.SUB, connect=self.endpoints.control)
        self.control.setsockopt(zmq.SUBSCRIBE, b"")
        # A topic no message carries: its arrival at the driver's XPUB says we are subscribed.
        self.control.setsockopt(zmq.SUBSCRIBE, f"rank{self.rank}".encode())
        self.acks = self.socket(zmq.PUSH, connect=self.endpoints.acks)
        self.next_step_id = 0
        self.in_flight: collections.deque[float] = collections.deque()  # submit times, in order
        self.rejected = DropCounter(log, "malformed control frames")
        beats = watch_socket(self.context, [self.endpoints.heartbeats[0]])
        self._sockets.append(beats)
        interval = self.config.runtime.heartbeat_interval_s
        self.liveness = LivenessWatch(beats, {0}, interval, first_beat_grace_s=60.0)
        self.spawn(self.liveness.run())

    async def serve(self) -> None:
        self.spawn(watch_for_hung_steps(self, self.config.runtime.hung_step_timeout_s))
        await self.acks.send_multipart(
            encode(PeerReady(rank=self.rank, num_blocks=self.loaded.num_blocks))
        )
        self.state = RankState.READY
        self.liveness.expect_beats_now(0)  # the driver is up: our sockets reached it
        self.spawn(self.plan_loop())

    async def plan_loop(self) -> None:
        while True:
            await asyncio.sleep(0)  # queued plans must not starve the heartbeat
            frames = await self.control.recv_multipart()
            try:
                message = CONTROL_DECODER.decode(frames)
            except ProtocolError as exc:
                self.rejected.count(str(exc))
                continue
            if isinstance(message, PlanMessage):
                await self.run_plan(message.plan)
            elif isinstance(message, WeightsStatus):
                self.spawn(self.run_weights_phase(message.phase))
            elif isinstance(message, Shutdown):
                if message.failed:
                    raise FatalError(ExitCode.PEER_LOST, f"the driver failed: {message.reason}")
                log.info("driver asked to stop: %s", message.reason)
                self.stop()
                return

    async def run_plan(self, plan) -> None:
        """Queue the plan on the executor without waiting for it: peers launch ahead as the
        driver does; a failed step is reported from its completion callback."""
        if plan.step_id != self.next_step_id:
            reason = f"expected step plan {self.next_step_id}, got {plan.step_id}: a plan was lost"
            await self.report_failure(plan.step_id, reason)
            raise FatalError(ExitCode.PLAN_GAP, reason)
        self.next_step_id += 1
        self.step_id = plan.step_id
        self.in_flight.append(time.monotonic())
        self.step_started_at = self.in_flight[0]
        loop = asyncio.get_running_loop()
        future = self.executor.submit(plan)
        future.add_done_callback(
            lambda done: loop.call_soon_threadsafe(self.check_step, plan.step_id, done)
        )

    def check_step(self, step_id: int, done) -> None:
        self.in_flight.popleft()
        self.step_started_at = self.in_flight[0] if self.in_flight else None
        if done.cancelled() or done.exception() is None:
            return
        exc = done.exception()
        reason = f"{type(exc).__name__}: {exc}"
        message = PeerFailed(rank=self.rank, step_id=step_id, reason=reason)
        try:  # queued at once (NOBLOCK): the rank is about to stop
            self.acks.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self.fail(ExitCode.FAILED, f"step {step_id} failed: {reason}")

    async def run_weights_phase(self, phase: WeightsPhase) -> None:
        """A phase of a weights update (or a memory release / resume), after the plans already
        queued; the driver waits for this rank's ack."""
        try:
            freed = await asyncio.wrap_future(self.executor.run_weights_phase(phase))
            ack = WeightsAck(rank=self.rank, op=phase.op, ok=True, freed_bytes=freed)
            if phase.op == "commit":
                self.weights_version = phase.version
        except Exception as exc:
            log.error("weights %s failed on rank %d: %s", phase.op, self.rank, exc)
            error = f"{type(exc).__name__}: {exc}"
            ack = WeightsAck(rank=self.rank, op=phase.op, ok=False, error=error)
        await self.acks.send_multipart(encode(ack))

    async def report_failure(self, step_id: int, reason: str) -> None:
        message = PeerFailed(rank=self.rank, step_id=step_id, reason=reason)
        try:
            await self.acks.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
