"""Rank 0 of a group: owns the scheduler, the task and admin sockets, and publishes numbered step
plans to its tensor-parallel peers. One coroutine per concern; nothing polls."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time

import zmq

from aioworker.core.admission import RequestValidator
from aioworker.core.block_manager import BlockManager
from aioworker.core.scheduler import Scheduler, SeqOutput
from aioworker.runtime import admin
from aioworker.runtime.drops import DropCounter
from aioworker.runtime.hung import watch_for_hung_steps
from aioworker.runtime.intake import Request, RequestIntake
from aioworker.runtime.liveness import LivenessWatch, watch_socket
from aioworker.runtime.metrics import WorkerMetrics
from aioworker.runtime.rank import FatalError, RankProgram
from aioworker.runtime.recorder import Recorder
from aioworker.runtime.results import ResultSender
from aioworker.runtime.state import ExitCode, RankState
from aioworker.runtime.stats import RecentMean
from aioworker.runtime.weights import WeightsCoordinator
from aioworker.wire.protocol import (
    ACK_DECODER,
    ADMIN_DECODER,
    AdminReply,
    Outputs,
    PeerFailed,
    PeerReady,
    PlanMessage,
    ProtocolError,
    Shutdown,
    TokenDelta,
    WeightsAck,
    encode,
)
from aioworker.wire.security import ServerSecurity, stop_authenticator

log = logging.getLogger(__name__)

# Steps launched ahead: one running, one queued behind it on the device.
MAX_IN_FLIGHT = 2
# How long the driver waits for every peer to load and subscribe.
PEER_STARTUP_TIMEOUT_S = 1800.0


class Driver(RequestIntake, RankProgram):
    # -- startup ------------------------------------------------------------------------------

    def bind_sockets(self) -> None:
        runtime = self.config.runtime
        self.tp_size = self.config.parallel.tensor_parallel_size
        self.security = ServerSecurity.from_config(self.config)
        # Before the CURVE sockets bind: without a ZAP handler libzmq admits any key.
        self.authenticator = self.security.start_authenticator(self.context)
        tasks, admin_endpoint = self.endpoints.tasks, self.endpoints.admin
        self.tasks = self.socket(zmq.PULL, bind=tasks, options=self.security.server_options(tasks))
        self.admin_socket = self.socket(
            zmq.ROUTER, bind=admin_endpoint, options=self.security.server_options(admin_endpoint)
        )
        self.results = ResultSender(runtime.result_hwm, self.security.result_options)
        self.requests: dict[str, Request] = {}
        self.seq_ids = itertools.count()
        self.rejected = DropCounter(log, "malformed frames")
        self.work = asyncio.Event()
        self.progress = asyncio.Event()  # set after every step and when steps stop
        self.in_flight: collections.deque = collections.deque()  # (plan, future, submitted_at)
        self.weights = WeightsCoordinator(self)
        # The loop's own time per step (scheduling, plan publishing, outputs), not the model's.
        self.loop_time = RecentMean()
        self.loop_cpu_time = RecentMean()  # the same, in this thread's CPU time
        self.scheduler: Scheduler | None = None
        self.metrics = None
        self.recorder = Recorder(runtime.record_path) if runtime.record_path else None
        self.results.recorder = self.recorder
        self.drain_timer: asyncio.TimerHandle | None = None
        self.control = self.acks = None
        if self.tp_size > 1:
            self.control = self.socket(zmq.XPUB, bind=self.endpoints.control)
            self.control.setsockopt(zmq.XPUB_VERBOSE, 1)
            self.acks = self.socket(zmq.PULL, bind=self.endpoints.acks)
            peers = list(range(1, self.tp_size))
            beats = watch_socket(self.context, [self.endpoints.heartbeats[r] for r in peers])
            self._sockets.append(beats)
            interval = runtime.heartbeat_interval_s
            self.liveness = LivenessWatch(beats, set(peers), interval, first_beat_grace_s=60.0)
            self.spawn(self.liveness.run())
        self.spawn(self.admin_loop())  # status answers while loading

    async def serve(self) -> None:
        num_blocks = self.loaded.num_blocks
        if self.tp_size > 1:
            num_blocks = min(num_blocks, await self.wait_for_peers())
        loaded, sched = self.loaded, self.config.scheduler
        self.scheduler = Scheduler(
            BlockManager(num_blocks, loaded.block_size),
            sched.max_num_seqs,
            sched.max_num_batched_tokens,
            loaded.max_model_len,
        )
        self.validator = RequestValidator(loaded.vocab_size, loaded.max_model_len)
        if self.config.runtime.metrics_port:
            port = self.config.runtime.metrics_port + self.group
            self.metrics = WorkerMetrics(self, port, self.config.runtime.host)
        self.state = RankState.READY
        log.info(
            "group %d ready: %d KV blocks of %d tokens", self.group, num_blocks, loaded.block_size
        )
        self.spawn(self.task_loop())
        self.spawn(self.step_loop())
        self.spawn(watch_for_hung_steps(self, self.config.runtime.hung_step_timeout_s))
        if self.tp_size > 1:
            self.spawn(self.ack_loop())
            self.spawn(self.control_inbound_loop())

    async def wait_for_peers(self) -> int:
        """Every peer's subscription seen on XPUB (no plan can be lost to a slow joiner) and
        every peer loaded; returns the smallest KV block count among them."""
        waiting_subscriptions = {f"rank{r}".encode() for r in range(1, self.tp_size)}
        ready: dict[int, int] = {}

        async def subscriptions() -> None:
            while waiting_subscriptions:
                frame = await self.control.recv()
                if frame[:1] == b"\x01":
                    waiting_subscriptions.discard(frame[1:])

        async def acks() -> None:
            while len(ready) < self.tp_size - 1:
                message = await self.recv_ack()
                if isinstance(message, PeerReady):
                    ready[message.rank] = message.num_blocks
                    self.liveness.expect_beats_now(message.rank)

        await asyncio.wait_for(asyncio.gather(subscriptions(), acks()), PEER_STARTUP_TIMEOUT_S)
        return min(ready.values())

    async def recv_ack(self):
        while True:
            frames = await self.acks.recv_multipart()
            try:
                message = ACK_DECODER.decode(frames)
            except ProtocolError as exc:
                self.count_rejected("acks", exc)
                continue
            if isinstance(message, PeerFailed):
                raise FatalError(
                    ExitCode.PEER_LOST,
                    f"rank {message.rank} failed at step {message.step_id}: {message.reason}",
                )
            return message

    async def control_inbound_loop(self) -> None:
        """XPUB delivers (un)subscriptions, and anything an XSUB sends upstream: count the rest."""
        while True:
            await asyncio.sleep(0)  # a flood here must not starve the other coroutines
            frame = await self.control.recv()
            if frame[:1] not in (b"\x00", b"\x01"):
                self.count_rejected(
                    "control", ProtocolError("data sent upstream on the control channel")
                )

    async def ack_loop(self) -> None:
        while True:
            message = await self.recv_ack()
            if isinstance(message, WeightsAck):
                self.weights.acks.put_nowait(message)
            await asyncio.sleep(0)

    def can_step(self) -> bool:
        """Steps run while serving or draining; weights and memory operations hold them."""
        return self.scheduler.has_work and self.state in (RankState.READY, RankState.DRAINING)

    async def wait_for(self, predicate) -> None:
        """Wait until `predicate()` holds; it is checked whenever a step completes."""
        while not predicate():
            self.progress.clear()
            await self.progress.wait()

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

    async def step_loop(self) -> None:
        """Keep up to MAX_IN_FLIGHT steps launched: the next plan is built and queued on the
        device while the current step runs, then the oldest step's tokens are delivered."""
        in_flight = self.in_flight
        while True:
            started, started_cpu = time.perf_counter(), time.thread_time()
            await self.launch_steps(in_flight)
            launched, launched_cpu = time.perf_counter(), time.thread_time()
            if not in_flight:
                self.progress.set()
                self.work.clear()
                await self.work.wait()
                continue
            plan, future, submitted_at = in_flight[0]
            self.step_id, self.step_started_at = plan.step_id, submitted_at
            try:
                result = await asyncio.wrap_future(future)
            except Exception as exc:
                reason = f"step {plan.step_id} failed: {type(exc).__name__}: {exc}"
                self.fail_all(reason)
                raise FatalError(ExitCode.FAILED, reason) from exc
            in_flight.popleft()
            self.step_started_at = in_flight[0][2] if in_flight else None
            returned, returned_cpu = time.perf_counter(), time.thread_time()
            self.deliver(self.scheduler.update(plan, result), plan.step_id)
            self.maybe_finish_drain()
            self.progress.set()
            self.loop_time.add(launched - started + time.perf_counter() - returned)
            self.loop_cpu_time.add(launched_cpu - started_cpu + time.thread_time() - returned_cpu)

    async def launch_steps(self, in_flight: collections.deque) -> None:
        while len(in_flight) < MAX_IN_FLIGHT and self.can_step():
            plan = self.scheduler.schedule()
            if plan is None:
                return
            if self.control is not None:
                await self.control.send_multipart(encode(PlanMessage(plan=plan)))
            in_flight.append((plan, self.executor.submit(plan), time.monotonic()))

    def deliver(self, outputs: list[SeqOutput], step_id: int) -> None:
        """One Outputs message per client for this step (runs per sequence: kept lean)."""
        by_client: dict[tuple[str, str | None], list[TokenDelta]] = {}
        find, version = self.requests.get, self.weights_version
        for request_id, token_id, reason in outputs:
            request = find(request_id)
            if request is None:
                continue
            delta = TokenDelta(request_id, [token_id], reason, None, version)
            client = (request.reply_to, request.client_key)
            deltas = by_client.get(client)
            if deltas is None:
                by_client[client] = [delta]
            else:
                deltas.append(delta)
            if request.first_token_at is None:
                self.on_first_token(request)
            if reason is not None:
                self.on_finished(request_id, reason)
        self.num_tokens_generated += len(outputs)
        if self.metrics is not None:
            self.metrics.on_step(len(outputs))
        for (reply_to, client_key), deltas in by_client.items():
            outputs = Outputs(group=self.group, step_id=step_id, deltas=deltas)
            self.results.send(reply_to, outputs, client_key)

    # -- lifecycle ----------------------------------------------------------------------------

    def start_drain(self, deadline_s: float) -> None:
        if self.state in (RankState.DRAINING, RankState.STOPPED, RankState.FAILED):
            return
        self.state = RankState.DRAINING
        loop = asyncio.get_running_loop()
        self.drain_timer = loop.call_later(
            deadline_s, self.abort_all, f"drain deadline of {deadline_s:g}s reached"
        )
        self.work.set()
        self.maybe_finish_drain()

    def maybe_finish_drain(self) -> None:
        if self.state is RankState.DRAINING and not self.requests:
            self.stop()

    def queue_depths(self) -> tuple[int, int, int, int]:
        if self.scheduler is None:
            return super().queue_depths()
        manager = self.scheduler.block_manager
        return (
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            manager.num_used_blocks,
            manager.num_blocks,
        )

    async def shutdown(self) -> None:
        if self.drain_timer is not None:
            self.drain_timer.cancel()
        if self.state is RankState.FAILED:
            self.fail_all(f"worker failed: {self.detail}")
        else:
            self.abort_all("worker shutting down")
        if self.control is not None:
            try:
                await self.control.send_multipart(
                    encode(self.shutdown_message()), flags=zmq.NOBLOCK
                )
            except zmq.ZMQError:
                pass
        self.results.close()
        if self.recorder is not None:
            self.recorder.close()
        stop_authenticator(self.authenticator)  # before the context terminates
        await super().shutdown()

    def shutdown_message(self) -> Shutdown:
        failed = self.state is RankState.FAILED
        return Shutdown(reason=self.detail or "driver stopped", failed=failed)

    # -- admin --------------------------------------------------------------------------------

    async def admin_loop(self) -> None:
        while True:
            await asyncio.sleep(0)
            frames = await self.admin_socket.recv_multipart()
            identity, body = frames[0], frames[1:]
            # A REQ client puts an empty delimiter before the body; echo it back.
            delimiter = [b""] if body[:1] == [b""] else []
            frames = body[len(delimiter) :]
            route = [identity, *delimiter]
            try:
                request = ADMIN_DECODER.decode(frames[:2])
            except ProtocolError as exc:
                self.count_rejected("admin", exc)
                await self.admin_socket.send_multipart(
                    [*route, *encode(AdminReply(ok=False, message=str(exc)))]
                )
                continue
            if request.command in admin.LONG_COMMANDS:
                # Minutes, perhaps: answered when done, while status and the rest stay live.
                self.spawn(self.answer_long(route, request, frames[2:]))
                continue
            reply = admin.handle(self, request)
            await self.admin_socket.send_multipart([*route, *encode(reply)])

    async def answer_long(self, route: list[bytes], request, raw_frames: list[bytes]) -> None:
        try:
            reply = await admin.handle_long(self, request, raw_frames)
        except Exception as exc:
            reply = AdminReply(
                ok=False, message=f"{request.command} failed: {type(exc).__name__}: {exc}"
            )
        await self.admin_socket.send_multipart([*route, *encode(reply)])
