"""Weights lifecycle on the driver: update (from a directory, a trainer's CUDA IPC tensors, or
tensors pushed over ZeroMQ), release and resume device memory, across every rank of the group.

An update is two-phase: every rank stages and validates its shard, and only if all succeed do
they commit; otherwise every rank discards its staged copy and the old weights stay. A commit
that fails on any rank leaves the ranks with different weights: the group stops with
WEIGHTS_DIVERGED rather than serve mixed weights. Steps are held while ranks change state, and
requests are never lost: the update mode decides what happens to running ones (wait: they finish
first; keep: they continue on the new weights; abort: they end with a reason). A drain asked for
meanwhile waits until the operation ends.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from pathlib import Path

from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.group_control import GroupControl
from aioworker.runtime.open_requests import OpenRequests
from aioworker.runtime.peer_group import PeerGroup
from aioworker.runtime.pushed_tensors import write_safetensors
from aioworker.runtime.state import ExitCode
from aioworker.wire.health import RankState
from aioworker.wire.protocol import AdminReply, AdminRequest

log = logging.getLogger(__name__)


class WeightsCoordinator:
    def __init__(self, control: GroupControl, requests: OpenRequests, peers: PeerGroup) -> None:
        self.control = control
        self.requests = requests
        self.peers = peers
        self.last_update_s: float | None = None
        self.busy = False

    # -- commands -----------------------------------------------------------------------------

    async def update(self, request: AdminRequest, raw_frames: list) -> AdminReply:
        control, core = self.control, self.control.core
        if control.state not in (RankState.READY, RankState.PAUSED, RankState.WEIGHTS_CLEARED):
            return AdminReply(ok=False, message=f"cannot update weights: worker is {control.state}")
        version = request.version if request.version is not None else core.weights_version + 1
        started = time.monotonic()
        async with _Hold(self, request.mode, RankState.UPDATING_WEIGHTS):
            error = await self._stage_and_commit(request, raw_frames, version)
            if error is None:  # before any step on the new weights: old KV must never serve
                core.reset_prefix_cache()
        if error is not None:
            return AdminReply(ok=False, message=error)
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
        # The state stays WEIGHTS_CLEARED (steps held) until resume-memory, failed or not: a rank
        # that freed part of its memory must not step.
        async with _Hold(self, "keep", RankState.WEIGHTS_CLEARED) as hold:
            hold.end_in(RankState.WEIGHTS_CLEARED)
            if request.kv_cache:
                control.core.scheduler.preempt_all()  # recomputed from their tokens after resume
            control.core.reset_prefix_cache()  # the KV cache's memory may be gone
            phase = WeightsPhase(op="release", weights=request.weights, kv_cache=request.kv_cache)
            error, freed = await self.peers.run_phase(phase, control.core.executor)
        if error is not None:
            return AdminReply(ok=False, message=f"release failed: {error}")
        text = f"released {freed / 2**30:.2f} GiB (as the devices report it); resume-memory to serve again"
        return AdminReply(ok=True, message=text, data={"freed_bytes": freed})

    async def resume(self) -> AdminReply:
        if self.control.state is not RankState.WEIGHTS_CLEARED:
            return AdminReply(
                ok=False, message=f"nothing to resume: worker is {self.control.state}"
            )
        async with _Hold(self, "keep", RankState.WEIGHTS_CLEARED) as hold:
            error = await self._on_every_rank(WeightsPhase(op="resume"))
            if error is None:
                hold.end_in(RankState.READY)
        if error is not None:
            return AdminReply(ok=False, message=f"resume failed: {error}")
        return AdminReply(ok=True, message="memory restored; serving")

    # -- phases -------------------------------------------------------------------------------

    async def _stage_and_commit(
        self, request: AdminRequest, raw_frames: list, version: int
    ) -> str | None:
        """Stage on every rank, then commit or roll back; the reason it failed, or None."""
        pushed_dir = None
        try:
            if request.pushed:
                pushed_dir = await asyncio.to_thread(_write_pushed, request, raw_frames)
            stage = _stage_phase(request, version, pushed_dir)
            error = await self._on_every_rank(stage)
            if error is not None:
                await self._on_every_rank(WeightsPhase(op="rollback", version=version))
                return f"update to version {version} failed, old weights kept: {error}"
            error = await self._on_every_rank(WeightsPhase(op="commit", version=version))
            if error is not None:
                reason = (
                    f"commit of version {version} failed ({error}); the ranks may hold different "
                    f"weights, so the group stops (exit {int(ExitCode.WEIGHTS_DIVERGED)})"
                )
                self.control.fail(ExitCode.WEIGHTS_DIVERGED, reason)
                return reason
            return None
        finally:
            if pushed_dir is not None:
                shutil.rmtree(pushed_dir, ignore_errors=True)

    async def _on_every_rank(self, phase: WeightsPhase) -> str | None:
        try:
            error, _ = await self.peers.run_phase(phase, self.control.core.executor)
        except TimeoutError:
            error = f"a peer did not finish {phase.op} within {self.peers.phase_timeout_s:g}s"
        return error


def _write_pushed(request: AdminRequest, raw_frames: list) -> Path:
    """Pushed tensors as a safetensors directory every rank can stage from (off the loop: GBs)."""
    directory = Path(tempfile.mkdtemp(prefix="aioworker-pushed-"))
    try:
        write_safetensors(directory / "model.safetensors", request.pushed, raw_frames)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def _stage_phase(request: AdminRequest, version: int, pushed_dir: Path | None) -> WeightsPhase:
    if pushed_dir is not None:
        return WeightsPhase(op="stage", version=version, path=str(pushed_dir))
    if request.ipc_tensors:
        return WeightsPhase(op="stage", version=version, ipc_tensors=request.ipc_tensors)
    if not request.argument:
        raise ValueError("update-weights needs a directory, IPC tensors or pushed tensors")
    return WeightsPhase(op="stage", version=version, path=request.argument)


class _Hold:
    """One weights operation at a time: it decides the fate of running requests (`mode`), holds
    the steps in `state`, and on the way out, whatever happened, moves back to the state it
    started from (or to the one given to `end_in`), releases the steps, and runs a drain that
    was asked for meanwhile."""

    def __init__(self, coordinator: WeightsCoordinator, mode: str, state: RankState) -> None:
        self.coordinator, self.mode, self.state = coordinator, mode, state
        self.end_state: RankState | None = None

    def end_in(self, state: RankState) -> None:
        self.end_state = state

    async def __aenter__(self) -> _Hold:
        coordinator, control = self.coordinator, self.coordinator.control
        if coordinator.busy:
            raise RuntimeError("another weights operation is in progress")
        coordinator.busy = True
        control.hold_drains()
        self.end_state = control.state
        try:
            await self._hold_steps(control)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _hold_steps(self, control: GroupControl) -> None:
        scheduler = control.core.scheduler
        if self.mode == "abort":
            requests = self.coordinator.requests
            for seq in list(scheduler.running):
                requests.abort(seq.request_id, "aborted for a weights update")
        if self.mode == "wait":
            scheduler.admit_new = False
            await control.wait_until(lambda: not scheduler.running)
        control.move(self.state)  # stepping stops: steps run only while READY or DRAINING
        await control.wait_until(lambda: not control.core.in_flight)

    async def __aexit__(self, *exc: object) -> None:
        control = self.coordinator.control
        control.core.scheduler.admit_new = True
        control.leave(self.state, self.end_state)
        self.coordinator.busy = False
        control.release_drains()
        control.wake()
