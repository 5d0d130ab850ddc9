"""Ranks 1..N-1 of a group: run every numbered plan the driver publishes, in order, on their
shard. A missing plan number means this rank's state has diverged: it reports and exits."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import Future

import zmq

from aioworker.core.executor import Executor
from aioworker.core.loaded_rank import LoadedRank
from aioworker.core.plan import StepPlan
from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.heartbeat import ServingInfo, expert_info, weights_info
from aioworker.runtime.hung import watch_for_hung_steps
from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.liveness import SUBSCRIBE_ALL, LivenessWatch
from aioworker.runtime.rank import Rank
from aioworker.runtime.state import ExitCode
from aioworker.wire.drops import DropCounter
from aioworker.wire.health import RankState
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


class Peer:
    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self.executor: Executor | None = None
        self.loaded: LoadedRank | None = None
        self.next_step_id = 0
        self.weights_version = 0
        self.in_flight: collections.deque[float] = collections.deque()  # submit times, in order
        self.rejected = DropCounter(log, "malformed control frames")
        self.unsent = DropCounter(log, "reports the driver may not have received")

    # -- the rank role ------------------------------------------------------------------------

    def bind(self) -> None:
        rank, endpoints, security = self.rank, self.rank.endpoints, self.rank.security
        options = security.rank_options(endpoints.control)
        self.control = rank.socket(zmq.SUB, connect=endpoints.control, options=options)
        self.control.setsockopt(zmq.SUBSCRIBE, b"")
        # A topic no message carries: its arrival at the driver's XPUB says we are subscribed.
        self.control.setsockopt(zmq.SUBSCRIBE, f"rank{rank.index}".encode())
        options = security.rank_options(endpoints.acks)
        self.acks = rank.socket(zmq.PUSH, connect=endpoints.acks, options=options)
        beat_options = {**SUBSCRIBE_ALL, **security.rank_options(endpoints.heartbeats[0])}
        beats = rank.socket(zmq.SUB, connect=endpoints.heartbeats[0], options=beat_options)
        interval = rank.config.runtime.heartbeat_interval_s
        self.liveness = LivenessWatch(beats, {0}, interval, first_beat_grace_s=60.0)
        rank.spawn(self.liveness.run())

    async def serve(self, executor: Executor, loaded: LoadedRank) -> None:
        self.executor, self.loaded = executor, loaded
        rank = self.rank
        rank.spawn(watch_for_hung_steps(rank.progress))
        ready = PeerReady(rank=rank.index, num_blocks=loaded.num_blocks, **weights_info(loaded))
        await self.acks.send_multipart(encode(ready))
        rank.lifecycle.move(RankState.READY)
        self.liveness.expect_beats_now(0)  # the driver is up: our sockets reached it
        rank.spawn(self.plan_loop())

    async def close(self) -> None:
        pass

    def serving_info(self) -> ServingInfo:
        total = self.loaded.num_blocks if self.loaded is not None else 0
        return ServingInfo(
            kv_blocks_total=total,
            weights_version=self.weights_version,
            **weights_info(self.loaded),
            **expert_info(self.loaded),
        )

    def on_stop_signal(self) -> None:
        """A serving peer keeps serving: it stops when its driver publishes Shutdown after
        draining. Before that, a signal stops it at once."""
        if self.rank.lifecycle.state is not RankState.READY:
            self.rank.lifecycle.stop()

    # -- plans and phases ---------------------------------------------------------------------

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
                self.rank.spawn(self.run_weights_phase(message.phase))
            elif isinstance(message, Shutdown):
                if message.failed:
                    raise FatalError(ExitCode.PEER_LOST, f"the driver failed: {message.reason}")
                log.info("driver asked to stop: %s", message.reason)
                self.rank.lifecycle.stop()
                return

    async def run_plan(self, plan: StepPlan) -> None:
        """Queue the plan on the executor without waiting for it: peers launch ahead as the
        driver does; a failed step is reported from its completion callback."""
        progress = self.rank.progress
        if plan.step_id != self.next_step_id:
            reason = f"expected step plan {self.next_step_id}, got {plan.step_id}: a plan was lost"
            await self.report_failure(plan.step_id, reason)
            raise FatalError(ExitCode.PLAN_GAP, reason)
        self.next_step_id += 1
        progress.step_id = plan.step_id
        self.in_flight.append(time.monotonic())
        progress.started_at = self.in_flight[0]
        loop = asyncio.get_running_loop()
        future = self.executor.submit(plan)
        future.add_done_callback(
            lambda done: loop.call_soon_threadsafe(self.check_step, plan.step_id, done)
        )

    def check_step(self, step_id: int, done: Future) -> None:
        self.in_flight.popleft()
        self.rank.progress.started_at = self.in_flight[0] if self.in_flight else None
        if done.cancelled() or done.exception() is None:
            return
        exc = done.exception()
        reason = f"{type(exc).__name__}: {exc}"
        message = PeerFailed(rank=self.rank.index, step_id=step_id, reason=reason)
        try:  # queued at once (NOBLOCK): the rank is about to stop
            self.acks.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.unsent.count(f"step {step_id} failure report: {exc}")
        self.rank.lifecycle.fail(ExitCode.FAILED, f"step {step_id} failed: {reason}")

    async def run_weights_phase(self, phase: WeightsPhase) -> None:
        """A phase of a weights update (or a memory release / resume), after the plans already
        queued; the driver waits for this rank's ack."""
        rank_id = self.rank.index
        try:
            freed = await asyncio.wrap_future(self.executor.run_weights_phase(phase))
            ack = WeightsAck(
                rank=rank_id, op=phase.op, version=phase.version, ok=True, freed_bytes=freed
            )
            if phase.op == "commit":
                self.weights_version = phase.version
        except Exception as exc:
            log.error("weights %s failed on rank %d: %s", phase.op, rank_id, exc)
            error = f"{type(exc).__name__}: {exc}"
            ack = WeightsAck(
                rank=rank_id, op=phase.op, version=phase.version, ok=False, error=error
            )
        await self.acks.send_multipart(encode(ack))

    async def report_failure(self, step_id: int, reason: str) -> None:
        message = PeerFailed(rank=self.rank.index, step_id=step_id, reason=reason)
        try:
            await self.acks.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.unsent.count(f"step {step_id} failure report: {exc}")
