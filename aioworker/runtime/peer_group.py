"""The driver's link to the other ranks of its tensor-parallel group: it publishes numbered plans
and weights phases on the control channel, collects acks, and watches the peers' heartbeats.
With one rank there are no peers, and plans and phases stay on the driver."""

from __future__ import annotations

import asyncio
import logging

import zmq

from aioworker.core.executor import Executor
from aioworker.core.plan import StepPlan
from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.liveness import SUBSCRIBE_ALL, LivenessWatch
from aioworker.runtime.rank import Rank
from aioworker.runtime.state import ExitCode
from aioworker.wire.drops import DropCounter
from aioworker.wire.protocol import (
    ACK_DECODER,
    PeerFailed,
    PeerReady,
    PlanMessage,
    ProtocolError,
    Shutdown,
    WeightsAck,
    WeightsStatus,
    encode,
)
from aioworker.wire.security import Role

log = logging.getLogger(__name__)

# How long the driver waits for every peer to load and subscribe.
PEER_STARTUP_TIMEOUT_S = 1800.0
# How long the driver waits for its peers to finish one phase (staging a large model from disk).
PHASE_TIMEOUT_S = 1800.0


class PeerGroup:
    def __init__(self, rank: Rank, rejected: DropCounter) -> None:
        self.rank = rank
        self.size = rank.config.parallel.tensor_parallel_size
        self.rejected = rejected
        self.unsent = DropCounter(log, "messages the peers may not have received")
        self.weights_acks: asyncio.Queue[WeightsAck] = asyncio.Queue()
        self.phase_timeout_s = PHASE_TIMEOUT_S
        # Each peer's PeerReady, by rank: its KV blocks and what its weights amount to.
        self.ready: dict[int, PeerReady] = {}
        self.control = self.acks = None
        self.liveness: LivenessWatch | None = None
        if self.size > 1:
            self._bind(rank)

    def _bind(self, rank: Rank) -> None:
        endpoints = rank.endpoints
        security = rank.security
        options = security.server_options(endpoints.control, Role.RANKS)
        self.control = rank.socket(zmq.XPUB, bind=endpoints.control, options=options)
        self.control.setsockopt(zmq.XPUB_VERBOSE, 1)
        options = security.server_options(endpoints.acks, Role.RANKS)
        self.acks = rank.socket(zmq.PULL, bind=endpoints.acks, options=options)
        peers = list(range(1, self.size))
        peer_beats = [endpoints.heartbeats[r] for r in peers]
        options = {**SUBSCRIBE_ALL, **security.rank_options(peer_beats[0])}
        beats = rank.socket(zmq.SUB, connect=peer_beats, options=options)
        interval = rank.config.runtime.heartbeat_interval_s
        self.liveness = LivenessWatch(beats, set(peers), interval, first_beat_grace_s=60.0)
        rank.spawn(self.liveness.run())

    async def wait_until_ready(self, num_blocks: int) -> int:
        """Every peer's subscription seen on XPUB (no plan can be lost to a slow joiner) and
        every peer loaded; returns the smallest KV block count of the group."""
        if self.size == 1:
            return num_blocks
        waiting_subscriptions = {f"rank{r}".encode() for r in range(1, self.size)}
        ready = self.ready

        async def subscriptions() -> None:
            while waiting_subscriptions:
                frame = await self.control.recv()
                if frame[:1] == b"\x01":
                    waiting_subscriptions.discard(frame[1:])

        async def acks() -> None:
            while len(ready) < self.size - 1:
                message = await self._recv_ack()
                if isinstance(message, PeerReady):
                    ready[message.rank] = message
                    self.liveness.expect_beats_now(message.rank)

        await asyncio.wait_for(asyncio.gather(subscriptions(), acks()), PEER_STARTUP_TIMEOUT_S)
        return min(num_blocks, *(message.num_blocks for message in ready.values()))

    def serve(self) -> None:
        if self.size > 1:
            self.rank.spawn(self._ack_loop())
            self.rank.spawn(self._control_inbound_loop())

    def publish_plan(self, plan: StepPlan) -> None:
        """Before the driver runs a plan, every peer gets it (XPUB never blocks a send)."""
        if self.control is not None:
            sent = self.control.send_multipart(encode(PlanMessage(plan=plan)))
            if sent.done() and sent.exception() is not None:
                raise sent.exception()

    async def run_phase(self, phase: WeightsPhase, executor: Executor) -> tuple[str | None, int]:
        """Run one weights phase on the driver and every peer: the first errors (or None), and
        the bytes freed in total."""
        if self.control is not None:
            await self.control.send_multipart(encode(WeightsStatus(phase=phase)))
        from_peers = asyncio.ensure_future(self._collect(phase))
        errors, freed = [], 0
        try:
            freed += await asyncio.wrap_future(executor.run_weights_phase(phase))
        except Exception as exc:
            errors.append(f"rank 0: {type(exc).__name__}: {exc}")
        for ack in await from_peers:
            freed += ack.freed_bytes
            if not ack.ok:
                errors.append(f"rank {ack.rank}: {ack.error}")
        error = "; ".join(errors) or None
        if error:
            log.error("weights %s failed: %s", phase.op, error)
        return error, freed

    async def send_shutdown(self, reason: str, failed: bool) -> None:
        if self.control is None:
            return
        try:
            message = Shutdown(reason=reason, failed=failed)
            await self.control.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.unsent.count(f"Shutdown: {exc}")

    # -- internals ----------------------------------------------------------------------------

    async def _collect(self, phase: WeightsPhase) -> list[WeightsAck]:
        """One ack from each peer for this phase: matched by (rank, operation, version), so a
        late ack of an earlier phase, or a second one from the same rank, counts for nothing."""
        acks: dict[int, WeightsAck] = {}
        peers = set(range(1, self.size))
        async with asyncio.timeout(self.phase_timeout_s):
            while len(acks) < len(peers):
                ack = await self.weights_acks.get()
                if ack.rank in peers and (ack.op, ack.version) == (phase.op, phase.version):
                    acks.setdefault(ack.rank, ack)
                else:
                    log.warning("ignored a weights ack that matches no phase in progress: %s", ack)
        return list(acks.values())

    async def _recv_ack(self):
        while True:
            frames = await self.acks.recv_multipart()
            try:
                message = ACK_DECODER.decode(frames)
            except ProtocolError as exc:
                self.rejected.count(f"acks channel: {exc}")
                continue
            if isinstance(message, PeerFailed):
                raise FatalError(
                    ExitCode.PEER_LOST,
                    f"rank {message.rank} failed at step {message.step_id}: {message.reason}",
                )
            return message

    async def _ack_loop(self) -> None:
        while True:
            message = await self._recv_ack()
            if isinstance(message, WeightsAck):
                self.weights_acks.put_nowait(message)
            await asyncio.sleep(0)

    async def _control_inbound_loop(self) -> None:
        """XPUB delivers (un)subscriptions, and anything an XSUB sends upstream: count the rest."""
        while True:
            await asyncio.sleep(0)  # a flood here must not starve the other coroutines
            frame = await self.control.recv()
            if frame[:1] not in (b"\x00", b"\x01"):
                self.rejected.count("control channel: data sent upstream on the control channel")
