"""The decode graphs capture whatever forward they are handed, and pad with the scratch row."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from aioworker.compute.step import cuda_graphs
from aioworker.compute.step.cuda_graphs import DecodeGraphs, capture_sizes


def test_the_graphs_are_handed_their_forward_and_never_reach_into_a_runner() -> None:
    params = list(inspect.signature(DecodeGraphs).parameters)
    assert params == ["forward", "max_batch", "scratch_row", "num_splits", "device", "queries"]
    source = inspect.getsource(cuda_graphs)
    assert "import aioworker" not in source and "from aioworker" not in source
    assert "runner." not in source


def test_capture_sizes_cover_every_batch_up_to_the_largest() -> None:
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert capture_sizes(3) == [1, 2, 3]


@pytest.mark.gpu
def test_a_replayed_graph_computes_its_forward_on_the_steps_inputs() -> None:
    device = torch.device("cuda")
    calls = []

    def forward(token_ids, positions, rows, query_lens, num_splits):
        calls.append(num_splits)
        return torch.stack([token_ids * 100 + positions, rows.expand(3, -1)[0]], dim=-1).float()

    graphs = DecodeGraphs(forward, 8, 99, lambda size: size + 1000, device)
    graphs.capture()
    assert sorted(set(calls)) == [1001, 1002, 1004, 1008]
    out = graphs.run(np.array([3, 4, 5]), np.array([7, 8, 9]), np.array([10, 11, 12]))
    assert out.tolist() == [[307.0, 10.0], [408.0, 11.0], [509.0, 12.0]]
    assert graphs.rows[3].item() == 99  # the padded row reads the scratch row
