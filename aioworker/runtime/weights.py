"""Weights lifecycle on the driver: update (from a directory, a trainer's CUDA IPC tensors, or
tensors pushed over ZeroMQ), release and resume device memory, across every rank of the group.

An update is two-phase: every rank stages and validates its shard, and only if all succeed do
they commit; otherwise every rank discards its staged copy and the old weights stay. Steps are
held while ranks change state, and requests are never lost: the update mode decides what
happens to running ones (wait: they finish first; keep: they continue on the new weights;
abort: they end with a reason).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path

from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.pushed_tensors import write_safetensors
from aioworker.runtime.state import RankState
from aioworker.wire.protocol import AdminReply, AdminRequest, WeightsAck, WeightsStatus, encode

log = logging.getLogger(__name__)

# How long the driver waits for its peers to finish one phase (staging a large model from disk).
PHASE_TIMEOUT_S = 1800.0


class WeightsCoordinator:
    def __init__(self, driver) -> None:
        self.driver = driver
        self.acks: asyncio.Queue[WeightsAck] = asyncio.Queue()
        self.last_update_s: float | None = None
        self.busy = False

    # -- commands -----------------------------------------------------------------------------

    async def update(self, request: AdminRequest, raw_frames: list[bytes]) -> AdminReply:
        driver = self.driver
        if driver.state not in (RankState.READY, RankState.PAUSED, RankState.WEIGHTS_CLEARED):
            return AdminReply(ok=False, message=f"cannot update weights: worker is {driver.state}")
        version = request.version if request.version is not None else driver.weights_version + 1
        started = time.monotonic()
        stage = self._stage_message(request, raw_frames, version)
        previous = driver.state
        async with self._held(request.mode, RankState.UPDATING_WEIGHTS):
            error = await self._on_every_rank(stage)
            if error is None:
                error = await self._on_every_rank(WeightsPhase(op="commit", version=version))
            else:
                await self._on_every_rank(WeightsPhase(op="rollback", version=version))
            driver.state = previous
        if error is not None:
            return AdminReply(
                ok=False, message=f"update to version {version} failed, old weights kept: {error}"
            )
        driver.weights_version = version
        self.last_update_s = time.monotonic() - started
        message = f"weights version {version} in place after {self.last_update_s:.2f}s"
        return AdminReply(
            ok=True, message=message, data={"version": version, "seconds": self.last_update_s}
        )

    async def release(self, request: AdminRequest) -> AdminReply:
        driver = self.driver
        if driver.state not in (RankState.READY, RankState.PAUSED):
            return AdminReply(ok=False, message=f"cannot release memory: worker is {driver.state}")
        async with self._held("keep", RankState.WEIGHTS_CLEARED):
            if request.kv_cache:
                driver.scheduler.preempt_all()  # recomputed from their tokens after resume
            phase = WeightsPhase(op="release", weights=request.weights, kv_cache=request.kv_cache)
            error, freed = await self._on_every_rank(phase, with_freed=True)
            # The state stays WEIGHTS_CLEARED (steps held) until resume-memory.
            driver.state = RankState.WEIGHTS_CLEARED
        if error is not None:
            return AdminReply(ok=False, message=f"release failed: {error}")
        text = f"released {freed / 2**30:.2f} GiB (as the devices report it); resume-memory to serve again"
        return AdminReply(ok=True, message=text, data={"freed_bytes": freed})

    async def resume(self) -> AdminReply:
        driver = self.driver
        if driver.state is not RankState.WEIGHTS_CLEARED:
            return AdminReply(ok=False, message=f"nothing to resume: worker is {driver.state}")
        error = await self._on_every_rank(WeightsPhase(op="resume"))
        if error is not None:
            return AdminReply(ok=False, message=f"resume failed: {error}")
        driver.state = RankState.READY
        driver.work.set()
        return AdminReply(ok=True, message="memory restored; serving")

    # -- phases -------------------------------------------------------------------------------

    def _stage_message(
        self, request: AdminRequest, raw_frames: list[bytes], version: int
    ) -> WeightsPhase:
        if request.pushed:
            directory = Path(tempfile.mkdtemp(prefix="aioworker-pushed-"))
            write_safetensors(directory / "model.safetensors", request.pushed, raw_frames)
            return WeightsPhase(op="stage", version=version, path=str(directory))
        if request.ipc_tensors:
            return WeightsPhase(op="stage", version=version, ipc_tensors=request.ipc_tensors)
        if not request.argument:
            raise ValueError("update-weights needs a directory, IPC tensors or pushed tensors")
        return WeightsPhase(op="stage", version=version, path=request.argument)

    async def _on_every_rank(self, phase: WeightsPhase, with_freed: bool = False):
        """Run one phase on this rank and every peer; the first error (or None), and with
        `with_freed` also the bytes freed in total."""
        driver = self.driver
        if driver.control is not None:
            await driver.control.send_multipart(encode(WeightsStatus(phase=phase)))
        from_peers = asyncio.ensure_future(self._collect(phase.op, driver.tp_size - 1))
        errors, freed = [], 0
        try:
            freed += await asyncio.wrap_future(driver.executor.run_weights_phase(phase))
        except Exception as exc:
            errors.append(f"rank 0: {type(exc).__name__}: {exc}")
        for ack in await from_peers:
            freed += ack.freed_bytes
            if not ack.ok:
                errors.append(f"rank {ack.rank}: {ack.error}")
        error = "; ".join(errors) or None
        if error:
            log.error("weights %s failed: %s", phase.op, error)
        return (error, freed) if with_freed else error

    async def _collect(self, op: str, count: int) -> list[WeightsAck]:
        acks = []
        while len(acks) < count:
            ack = await asyncio.wait_for(self.acks.get(), PHASE_TIMEOUT_S)
            if ack.op == op:
                acks.append(ack)
        return acks

    def _held(self, mode: str, state: RankState):
        return _Hold(self, mode, state)


class _Hold:
    """Hold stepping for the duration (after `mode` decides the fate of running requests)."""

    def __init__(self, coordinator: WeightsCoordinator, mode: str, state: RankState) -> None:
        self.coordinator, self.mode, self.state = coordinator, mode, state

    async def __aenter__(self) -> None:
        driver = self.coordinator.driver
        if self.coordinator.busy:
            raise RuntimeError("another weights operation is in progress")
        self.coordinator.busy = True
        if self.mode == "abort":
            for seq in list(driver.scheduler.running):
                driver.abort(seq.request_id, "aborted for a weights update")
        if self.mode == "wait":
            driver.scheduler.admit_new = False
            await driver.wait_for(lambda: not driver.scheduler.running)
        driver.state = self.state  # stepping stops: can_step() is False outside READY
        await driver.wait_for(lambda: driver.num_in_flight == 0)

    async def __aexit__(self, *exc: object) -> None:
        driver = self.coordinator.driver
        driver.scheduler.admit_new = True
        self.coordinator.busy = False
        driver.work.set()
