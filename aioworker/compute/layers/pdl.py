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
PDL on every launch. Decode graphs of more than MAX_GRAPH_BATCH sequences are captured without
it: W4 on the H200 measured the 8B's batch-8 step 6-7% slower with it, where batch 1 gained
2-20%; with the limit, batch 8 measured no slower (2026-12-05). Tools and tests may switch it
on for every launch. Each launch asks `launch_options()`.

Early reads (device.pdl_early_reads, off until W4 measures them): a kernel so launched may,
before its wait, read what no kernel of the step writes. The paged decode kernel fetches its
split's first K and V tiles into L2 (at batch 1 a split is about one tile, and the kernel was
three dependent DRAM round trips after its wait); the add-and-norm kernel loads its norm's
weight. Kernels ask `early_reads()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

MAX_GRAPH_BATCH = 4
_enabled = False  # launches now use it
_in_graphs = False  # decode graphs of at most MAX_GRAPH_BATCH sequences use it
_early_reads = False  # kernels launched with it read what the step does not write first


def enable(on: bool, graphs_only: bool = False, early_reads: bool = False) -> None:
    """Launches use PDL (`graphs_only`: only inside `for_graph_batch`, as a rank runs), with
    `early_reads` where asked."""
    global _enabled, _in_graphs, _early_reads
    _enabled, _in_graphs, _early_reads = on and not graphs_only, on, on and early_reads


@contextlib.contextmanager
def for_graph_batch(batch: int) -> Iterator[None]:
    """Within: launches as a decode graph of `batch` sequences captures them (PDL where it is
    switched on and `batch` <= MAX_GRAPH_BATCH); afterwards as before."""
    global _enabled
    before = _enabled
    _enabled = _in_graphs and batch <= MAX_GRAPH_BATCH
    try:
        yield
    finally:
        _enabled = before


def launch_options() -> dict[str, bool]:
    """Triton launch keywords: {"launch_pdl": True} where switched on, else none. Pass PDL=
    bool(options) to the kernel too, so that it waits."""
    return {"launch_pdl": True} if _enabled else {}


def early_reads() -> bool:
    """Whether a kernel launched now reads, before its wait, what no kernel of the step writes
    (launched with PDL, and device.pdl_early_reads on)."""
    return _enabled and _early_reads
