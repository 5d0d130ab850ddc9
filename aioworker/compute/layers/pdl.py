"""Programmatic dependent launch (Hopper and later), for the kernels of a decode step: each is
launched so that the GPU may start it while the kernel before it is still finishing, instead of
after that kernel has finished, drained and flushed. A decode step is a chain of a few hundred
short kernels, so those gaps add up.

The contract that keeps this correct: a kernel launched so waits for the kernel before it
(`wait_for_previous_kernel`, griddepcontrol.wait) before it reads or writes any memory, and
every kernel does so, so each waits, through the one before it, on all earlier ones. Kernels
not launched so (torch's, cuBLAS's) are ordered as usual.

device.pdl switches it for the rank's process (`enable`, at model load), for decode graphs only
(`for_graph_batch`): eager steps are bound by the host, where a launch's PDL attribute adds
cost and nothing overlaps, and W1 (mostly eager prefill and large batches) measured 0.978x with
PDL on every launch. Decode graphs of more than device.pdl_max_batch sequences (MAX_GRAPH_BATCH
by default) are captured without it: W4 on the H200 measured the 8B's batch-8 step 6-7% slower
with it, where batch 1 gained 2-20%; with the limit, batch 8 measured no slower (2026-12-05).
The 0.6B's batch-8 step measured 1.10x faster with it in the same runs, and on an H100
(2026-12-06) every 8B format but wint8 gained too, which is why the limit is a setting. A rank
whose projections are of a format in device.pdl_off_formats (wint8 by default) does not switch
it on at all: wint8's batch-1 step measured 0.92x with it on an H100. Tools and tests may
switch it on for every launch. Each launch asks `launch_options()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

MAX_GRAPH_BATCH = 4  # device.pdl_max_batch's default
_enabled = False  # launches now use it
_in_graphs = False  # decode graphs of at most _max_graph_batch sequences use it
_max_graph_batch = MAX_GRAPH_BATCH


def enable(on: bool, graphs_only: bool = False, max_graph_batch: int = MAX_GRAPH_BATCH) -> None:
    """Launches use PDL (`graphs_only`: only inside `for_graph_batch`, as a rank runs, for
    graphs of at most `max_graph_batch` sequences)."""
    global _enabled, _in_graphs, _max_graph_batch
    _enabled, _in_graphs = on and not graphs_only, on
    _max_graph_batch = max_graph_batch


def max_graph_batch() -> int:
    return _max_graph_batch


@contextlib.contextmanager
def for_graph_batch(batch: int) -> Iterator[None]:
    """Within: launches as a decode graph of `batch` sequences captures them (PDL where it is
    switched on and `batch` <= max_graph_batch()); afterwards as before."""
    global _enabled
    before = _enabled
    _enabled = _in_graphs and batch <= _max_graph_batch
    try:
        yield
    finally:
        _enabled = before


def switched_on() -> bool:
    """Whether any launch may use PDL (the process's setting, graphs only or not)."""
    return _enabled or _in_graphs


def launch_options() -> dict[str, bool]:
    """Triton launch keywords: {"launch_pdl": True} where switched on, else none. Pass PDL=
    bool(options) to the kernel too, so that it waits."""
    return {"launch_pdl": True} if _enabled else {}
