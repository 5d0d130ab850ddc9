"""CUDA graphs for decode steps: one graph per captured batch size, replayed with the step's
token ids, positions and block-table rows copied into static buffers. A batch is padded up to
the nearest captured size with rows that touch only the scratch row; larger batches run eagerly.
Graphs of `queries` > 1 serve steps that verify drafts: each sequence has that many token slots,
of which its query count (data, not shape) are real.

Replaying a graph turns the hundreds of small kernel launches of a decode step into one. The
graphs know nothing of the runner: they are handed the forward to capture (a `DecodeForward`),
the scratch row that padding reads, and the split count for each size.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
from collections.abc import Callable, Iterator

import numpy as np
import torch

# (token_ids [B * Q], positions [B * Q], block-table rows [B], query counts [B], num_splits)
# -> logits [B * Q, V], Q query slots per sequence; every tensor op in it must be graph-safe.
DecodeForward = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor
]


# Verify graphs are captured for batches up to this many sequences: speculation pays where
# batches are small, and larger verify steps run eagerly.
MAX_VERIFY_GRAPH_BATCH = 64


def capture_sizes(max_batch: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(
        self,
        forward: DecodeForward,
        max_batch: int,
        scratch_row: int,
        num_splits: Callable[[int], int],
        device: torch.device,
        queries: int = 1,
    ) -> None:
        self.forward = forward
        self.max_batch = max_batch
        self.scratch_row = scratch_row
        self.device = device
        self.queries = queries
        self.sizes = capture_sizes(max_batch)
        slots = max_batch * queries
        self.token_ids = torch.zeros(slots, dtype=torch.int64, device=device)
        self.positions = torch.zeros(slots, dtype=torch.int64, device=device)
        self.rows = torch.full((max_batch,), scratch_row, dtype=torch.int64, device=device)
        self.query_lens = torch.ones(max_batch, dtype=torch.int64, device=device)
        # A ring of pinned staging buffers: while one step's copies wait behind steps still on
        # the GPU, the next step must not overwrite them (two steps are in flight, one prepared).
        # Rows: token ids, positions (per slot), block-table rows, query counts (per sequence).
        self.staging = [torch.zeros(4, slots, dtype=torch.int64, pin_memory=True) for _ in range(4)]
        self.num_runs = 0  # also turns the ring
        self.num_device_runs = 0
        self.splits = {size: num_splits(size) for size in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool."""
        with without_garbage_collection():
            self._capture_all()

    def _capture_all(self) -> None:
        pool = None
        for size in reversed(self.sizes):
            slots = size * self.queries
            args = (
                self.token_ids[:slots],
                self.positions[:slots],
                self.rows[:size],
                self.query_lens[:size],
                self.splits[size],
            )
            for _ in range(2):  # compile and warm the kernels outside the capture
                self.forward(*args)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self.forward(*args)
            pool = graph.pool()
            self.graphs[size] = graph

    def size_for(self, num_seqs: int) -> int:
        """The captured batch size whose graph serves `num_seqs` sequences (at most max_batch):
        the smallest that holds them."""
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def run_on_device(
        self, token_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """`run` for one query per sequence with inputs already on the device (a draft step's
        tokens are the previous draft step's output): device copies, no host staging."""
        n = len(rows)
        size = self.size_for(n)
        self.num_device_runs += 1
        self.token_ids[:n].copy_(token_ids)
        self.positions[:n].copy_(positions)
        self.rows[:n].copy_(rows)
        self.token_ids[n:size].zero_()
        self.positions[n:size].zero_()
        self.rows[n:size].fill_(self.scratch_row)
        self.graphs[size].replay()
        return self.logits[size][:n]

    def run(
        self,
        token_ids: np.ndarray,
        positions: np.ndarray,
        rows: np.ndarray,
        query_lens: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Logits [n * Q, V] for n sequences of Q token slots each (token_ids and positions
        [n * Q]; query_lens [n], None for one query each); n must not exceed max_batch."""
        n = len(rows)
        size = self.size_for(n)
        used, slots = n * self.queries, size * self.queries
        staging = self.staging[self.num_runs % len(self.staging)]
        self.num_runs += 1
        staged = staging.numpy()
        staged[0, :used], staged[1, :used] = token_ids, positions
        staged[0, used:slots], staged[1, used:slots] = 0, 0
        staged[2, :n], staged[2, n:size] = rows, self.scratch_row
        staged[3, :n] = 1 if query_lens is None else query_lens
        staged[3, n:size] = 1
        self.token_ids[:slots].copy_(staging[0, :slots], non_blocking=True)
        self.positions[:slots].copy_(staging[1, :slots], non_blocking=True)
        self.rows[:size].copy_(staging[2, :size], non_blocking=True)
        if self.queries > 1:
            self.query_lens[:size].copy_(staging[3, :size], non_blocking=True)
        self.graphs[size].replay()
        return self.logits[size][:used]


@contextlib.contextmanager
def without_garbage_collection() -> Iterator[None]:
    """Collect now, then not until the block ends. A collection during a capture may free dead
    CUDA graphs (an engine left in a reference cycle), and destroying a graph while a stream
    captures invalidates the capture. On an H100 the composed GPU tests lost one, after an earlier
    test's engines, with a warning from each old graph destroyed mid-capture; alone it passed."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
