"""Programmatic dependent launch (Hopper and later), for the kernels of a decode step: each is
launched so that the GPU may start it while the kernel before it is still finishing, instead of
after that kernel has finished, drained and flushed. A decode step is a chain of a few hundred
short kernels, so those gaps add up.

The contract that keeps this correct: a kernel launched so waits for the kernel before it
(`wait_for_previous_kernel`, griddepcontrol.wait) before it reads or writes any memory, and
every kernel does so, so each waits, through the one before it, on all earlier ones. Kernels
not launched so (torch's, cuBLAS's) are ordered as usual.

device.pdl switches it for the rank's process (`enable`, at model load); each launch asks
`launch_options()`. Decode graphs of more than MAX_GRAPH_BATCH sequences are captured without
it (`for_graph_batch`): W4 on the H200 measured the 8B's batch-8 step 6-7% slower with it, where
batch 1 gained 2-20%. (That limit itself is not yet measured: the GPU was gone by then.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

MAX_GRAPH_BATCH = 4
_enabled = False


def enable(on: bool) -> None:
    global _enabled
    _enabled = on


@contextlib.contextmanager
def for_graph_batch(batch: int) -> Iterator[None]:
    """Within: launches as a decode graph of `batch` sequences captures them (no PDL above
    MAX_GRAPH_BATCH); afterwards as before."""
    global _enabled
    before = _enabled
    _enabled = before and batch <= MAX_GRAPH_BATCH
    try:
        yield
    finally:
        _enabled = before


def launch_options() -> dict[str, bool]:
    """Triton launch keywords: {"launch_pdl": True} where switched on, else none. Pass PDL=
    bool(options) to the kernel too, so that it waits."""
    return {"launch_pdl": True} if _enabled else {}
