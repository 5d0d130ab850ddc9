"""The weight operations a rank runs on its executor thread, whatever asked for them (the
driver's admin command, or the driver's WeightsStatus for a peer)."""

from __future__ import annotations

from aioworker.compute.weights.staging import commit, stage, stage_from_directory
from aioworker.core.weights_phase import WeightsPhase


def run_weights_phase(runner, phase: WeightsPhase) -> int:
    """Apply one phase; returns bytes freed (release) or 0. Raises on failure."""
    if phase.op == "stage":
        runner.staged = _stage(runner, phase)
    elif phase.op == "commit":
        _commit(runner)
    elif phase.op == "rollback":
        runner.staged = None
    elif phase.op == "release":
        return runner.memory.release(phase.weights, phase.kv_cache)
    elif phase.op == "resume":
        runner.memory.resume()
    return 0


def _stage(runner, phase: WeightsPhase):
    if phase.ipc_tensors:
        from aioworker.compute.weights.ipc import rebuild

        tensors = ((t.name, rebuild(t)) for t in phase.ipc_tensors)
        return stage(runner.model, tensors, on_device=True)
    return stage_from_directory(runner.model, phase.path)


def _commit(runner) -> None:
    staged = getattr(runner, "staged", None)
    if staged is None:
        raise RuntimeError("commit without staged weights: the ranks' update phases diverged")
    if runner.memory.weights_released:
        runner.memory.offloaded = staged  # applied to the device when memory is resumed
    else:
        commit(runner.model, staged)
    runner.staged = None
