"""A rank's live weights after loading: the update staged between the two phases of a weights
update, and the device memory that release and resume act on. It runs each WeightsPhase on the
executor thread, whatever asked for it (the driver's admin command, or the driver's WeightsStatus
for a peer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from aioworker.compute.weights.memory import DeviceMemory
from aioworker.compute.weights.staging import commit, directory_tensors, stage_models
from aioworker.core.weights_phase import WeightsPhase

if TYPE_CHECKING:
    from aioworker.compute.step.runner import ModelRunner


class RankWeights:
    def __init__(self, runner: ModelRunner, reallocate_cache: Callable[[], None]) -> None:
        self.model = runner.model
        self.models = runner.weight_models()  # by the prefix an update names them with
        self.memory = DeviceMemory(runner, reallocate_cache)
        # From stage to commit or rollback: per model prefix, its staged tensors.
        self.staged: dict[str, dict[str, torch.Tensor]] | None = None

    def run_phase(self, phase: WeightsPhase) -> int:
        """Apply one phase; returns bytes freed (release) or 0. Raises on failure."""
        match phase.op:
            case "stage":
                self.staged = self._stage(phase)
            case "commit":
                self._commit()
            case "rollback":
                self.staged = None
            case "release":
                return self.memory.release(phase.weights, phase.kv_cache)
            case "resume":
                self.memory.resume()
        return 0

    def _stage(self, phase: WeightsPhase) -> dict[str, dict[str, torch.Tensor]]:
        if phase.ipc_tensors:
            from aioworker.compute.weights.ipc import rebuild

            tensors = ((t.name, rebuild(t)) for t in phase.ipc_tensors)
            return stage_models(self.models, tensors, on_device=True)
        return stage_models(self.models, directory_tensors(phase.path))

    def _commit(self) -> None:
        if self.staged is None:
            raise RuntimeError("commit without staged weights: the ranks' update phases diverged")
        for prefix, staged in self.staged.items():
            if self.memory.weights_released:  # applied to the device when memory is resumed
                self.memory.offloaded.update({prefix + n: t for n, t in staged.items()})
            else:
                commit(self.models[prefix], staged)
        self.staged = None
