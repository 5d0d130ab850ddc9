"""The expert-load meter on the CPU: every launched step is counted, and the counts read cover
the steps before the one launching (their tokens are on the host only after they ran)."""

from __future__ import annotations

import torch

from aioworker.compute.layers.moe.experts import FusedExperts
from aioworker.compute.layers.moe.load_meter import ExpertLoadMeter, expert_load_meter
from aioworker.compute.layers.moe.storage import FORMATS, ExpertStorage
from aioworker.compute.parallel import TensorParallel


def experts() -> FusedExperts:
    layer = FusedExperts(4, 2, 8, 6, TensorParallel(), ExpertStorage(FORMATS["none"]))
    for param in layer.parameters():
        param.data.normal_()
    return layer


def step(layers: list[FusedExperts], ids: list[list[int]]) -> None:
    x = torch.randn(len(ids), 8)
    for layer in layers:
        layer.multiply(x, torch.tensor(ids, dtype=torch.int32), torch.ones(len(ids), 2))


def test_readings_sum_the_layers_and_count_the_steps_before_the_launch() -> None:
    layers = [experts(), experts()]
    meter = ExpertLoadMeter(layers)
    assert meter.read().tokens == (0, 0, 0, 0) and meter.read().num_layers == 2
    meter.on_launch()
    step(layers, [[0, 1], [0, 3]])
    meter.on_launch()  # the second step: the first's counts are read
    load = meter.read()
    assert load.tokens == (4, 2, 0, 2) and load.num_steps == 1
    assert load.layout == "all 4 experts, hidden slice 0+6" and load.first_expert == 0


def test_a_dense_model_has_no_meter() -> None:
    assert expert_load_meter(torch.nn.Linear(2, 2)) is None
