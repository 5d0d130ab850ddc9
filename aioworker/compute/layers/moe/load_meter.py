"""Reads how many tokens went to each of this rank's experts without stalling a step: every MoE
layer counts on the device as it routes (FusedExperts.routed_tokens), and about once per period
the executor thread sums the counts into a host buffer by an asynchronous copy; the reading it
publishes is the last copy that has landed, so readers on other threads (heartbeats) never
touch the device."""

from __future__ import annotations

import time

import torch
from torch import nn

from aioworker.compute.layers.moe.experts import FusedExperts
from aioworker.core.expert_load import ExpertLoad

PERIOD_S = 0.5


class ExpertLoadMeter:
    def __init__(self, layers: list[FusedExperts], period_s: float = PERIOD_S) -> None:
        self.layers = layers
        self.period_s = period_s
        self.num_steps = 0
        self.layout = layers[0].layout
        self._published = ExpertLoad(
            self.layout.describe(), self.layout.experts.start, (0,) * self.layout.experts.size,
            0, len(layers),
        )  # fmt: skip
        self._pending: tuple[torch.Tensor, torch.cuda.Event | None, int] | None = None
        self._sampled_at = 0.0

    def on_launch(self) -> None:
        """The executor thread, before each step: count it, publish a copy that has landed,
        start one when the period is up (on the CPU, where a copy costs no wait, every step)."""
        self.num_steps += 1
        if self._pending is not None:
            host, event, steps = self._pending
            if event is not None and not event.query():
                return
            self._publish(host, steps)
        now = time.monotonic()
        on_cpu = not self.layers[0].routed_tokens.is_cuda
        if on_cpu or now - self._sampled_at >= self.period_s:
            self._sampled_at = now
            self._pending = self._copy()
            if on_cpu:
                self._publish(*self._pending[::2])

    def _publish(self, host: torch.Tensor, steps: int) -> None:
        self._published = self._published._replace(tokens=tuple(host.tolist()), num_steps=steps)
        self._pending = None

    def _copy(self) -> tuple[torch.Tensor, torch.cuda.Event | None, int]:
        """The counts summed over layers, on their way to the host; the steps they cover (all
        but the one about to launch)."""
        total = torch.stack([layer.routed_tokens for layer in self.layers]).sum(0)
        if not total.is_cuda:
            return total, None, self.num_steps - 1
        host = torch.empty(total.shape, dtype=total.dtype, pin_memory=True)
        host.copy_(total, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event, self.num_steps - 1

    def read(self) -> ExpertLoad:
        """Any thread: the latest landed reading."""
        return self._published


def expert_load_meter(model: nn.Module) -> ExpertLoadMeter | None:
    """A meter over the model's MoE layers; None for a dense model."""
    layers = [module for module in model.modules() if isinstance(module, FusedExperts)]
    return ExpertLoadMeter(layers) if layers else None
