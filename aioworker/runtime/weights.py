"""Weights lifecycle on the driver: update (from a directory, a trainer's CUDA IPC tensors, or
tensors pushed over ZeroMQ), release and resume device memory, across every rank of the group.

An update is two-phase: every rank stages and validates its shard, and only if all succeed do
they commit; otherwise every rank discards its staged copy and the old weights stay. Steps are
held while ranks change state, and requests are never lost: the update mode decides what
happens to running ones (wait: they finish first; keep: they continue on the new weights;
abort: they end with a reason).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.group_control import GroupControl
from aioworker.runtime.peer_group import PeerGroup
from aioworker.runtime.pushed_tensors import write_safetensors
from aioworker.wire.health import RankState
from aioworker.wire.protocol import AdminReply, AdminRequest

log = logging.getLogger(__name__)


class WeightsCoordinator:
    def __init__(self, control: GroupControl, peers: PeerGroup) -> None:
        self.control = control
        self.peers = peers
        self.last_update_s: float | None = None
        self.busy = False

    # -- commands -----------------------------------------------------------------------------

    async def update(self, request: AdminRequest, raw_frames: list[bytes]) -> AdminReply:
        control, core = self.control, self.control.core
        if control.state not in (RankState.READY, RankState.PAUSED, RankState.WEIGHTS_CLEARED):
            return AdminReply(ok=False, message=f"cannot update weights: worker is {control.state}")
        version = request.version if request.version is not None else core.weights_version + 1
        started = time.monotonic()
        stage = self._stage_phase(request, raw_frames, version)
        previous = control.state
        async with _Hold(self, request.mode, RankState.UPDATING_WEIGHTS):
            error = await self._on_every_rank(stage)
            if error is None:
                error = await self._on_every_rank(WeightsPhase(op="commit", version=version))
            else:
                await self._on_every_rank(WeightsPhase(op="rollback", version=version))
            control.leave(RankState.UPDATING_WEIGHTS, previous)
        if error is not None:
            return AdminReply(
                ok=False, message=f"update to version {version} failed, old weights kept: {error}"
            )
        core.weights_version = version
        self.last_update_s = time.monotonic() - started
        message = f"weights version {version} in place after {self.last_update_s:.2f}s"
        return AdminReply(
            ok=True, message=message, data={"version": version, "seconds": self.last_update_s}
        )

    async def release(self, request: AdminRequest) -> AdminReply:
        control = self.control
        if control.state not in (RankState.READY, RankState.PAUSED):
            return AdminReply(ok=False, message=f"cannot release memory: worker is {control.state}")
        # The state stays WEIGHTS_CLEARED (steps held) until resume-memory.
        async with _Hold(self, "keep", RankState.WEIGHTS_CLEARED):
            if request.kv_cache:
                control.core.scheduler.preempt_all()  # recomputed from their tokens after resume
            phase = WeightsPhase(op="release", weights=request.weights, kv_cache=request.kv_cache)
            error, freed = await self.peers.run_phase(phase, control.core.executor)
        if error is not None:
            return AdminReply(ok=False, message=f"release failed: {error}")
        text = f"released {freed / 2**30:.2f} GiB (as the devices report it); resume-memory to serve again"
        return AdminReply(ok=True, message=text, data={"freed_bytes": freed})

    async def resume(self) -> AdminReply:
        control = self.control
        if control.state is not RankState.WEIGHTS_CLEARED:
            return AdminReply(ok=False, message=f"nothing to resume: worker is {control.state}")
        error = await self._on_every_rank(WeightsPhase(op="resume"))
        if error is not None:
            return AdminReply(ok=False, message=f"resume failed: {error}")
        control.leave(RankState.WEIGHTS_CLEARED, RankState.READY)
        control.wake()
        return AdminReply(ok=True, message="memory restored; serving")

    # -- phases -------------------------------------------------------------------------------

    def _stage_phase(
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

    async def _on_every_rank(self, phase: WeightsPhase) -> str | None:
        error, _ = await self.peers.run_phase(phase, self.control.core.executor)
        return error


class _Hold:
    """Hold stepping for the duration (after `mode` decides the fate of running requests)."""

    def __init__(self, coordinator: WeightsCoordinator, mode: str, state: RankState) -> None:
        self.coordinator, self.mode, self.state = coordinator, mode, state

    async def __aenter__(self) -> None:
        control = self.coordinator.control
        scheduler = control.core.scheduler
        if self.coordinator.busy:
            raise RuntimeError("another weights operation is in progress")
        self.coordinator.busy = True
        if self.mode == "abort":
            for seq in list(scheduler.running):
                control.abort(seq.request_id, "aborted for a weights update")
        if self.mode == "wait":
            scheduler.admit_new = False
            await control.wait_until(lambda: not scheduler.running)
        control.move(self.state)  # stepping stops: steps run only while READY or DRAINING
        await control.wait_until(lambda: not control.core.in_flight)

    async def __aexit__(self, *exc: object) -> None:
        control = self.coordinator.control
        control.core.scheduler.admit_new = True
        self.coordinator.busy = False
        control.wake()
