"""The decode graphs capture whatever forward they are handed, and pad with the scratch row."""

from __future__ import annotations

import gc
import inspect
import types

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


def test_a_batch_is_served_by_the_smallest_captured_size_that_holds_it() -> None:
    graphs = types.SimpleNamespace(sizes=capture_sizes(40))
    assert [DecodeGraphs.size_for(graphs, n) for n in (1, 3, 8, 9, 33, 40)] == [1, 4, 8, 16, 40, 40]


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


class _Dying:
    """Marks when the collector frees it (it is in a reference cycle)."""

    freed: list[bool] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Dying.freed.append(gc.isenabled())


def test_captures_collect_first_and_not_during() -> None:
    """A dead cycle is freed on entry, while collection may still run; none runs inside."""
    _Dying.freed.clear()
    _Dying()
    with cuda_graphs.without_garbage_collection():
        assert _Dying.freed == [True] and not gc.isenabled()
        _Dying()
        containers = [[] for _ in range(3 * gc.get_threshold()[0])]  # would trigger a collection
        assert len(_Dying.freed) == 1 and len(containers) > 0
    assert gc.isenabled()
    gc.collect()
    assert len(_Dying.freed) == 2
    gc.disable()
    try:
        with cuda_graphs.without_garbage_collection():
            pass
        assert not gc.isenabled()  # left as found
    finally:
        gc.enable()


@pytest.mark.gpu
def test_dead_graphs_in_a_cycle_do_not_break_the_next_capture() -> None:
    """The old graphs' destruction during a capture invalidated it (after a test's engines)."""
    device = torch.device("cuda")

    def forward(token_ids, positions, rows, query_lens, num_splits):
        return (token_ids * 2 + positions).float()[:, None]

    old = DecodeGraphs(forward, 8, 99, lambda size: 1, device)
    old.capture()
    old.me = old
    del old
    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # a collection at nearly every allocation
    try:
        new = DecodeGraphs(forward, 8, 99, lambda size: 1, device)
        new.capture()
    finally:
        gc.set_threshold(*thresholds)
    assert len(new.graphs) == len(capture_sizes(8))
