"""CUDA graphs for decode steps: one graph per captured batch size, replayed with the step's
token ids, positions and block-table rows copied into static buffers. A batch is padded up to
the nearest captured size with rows that touch only the scratch block; larger batches run eagerly.

Replaying a graph turns the hundreds of small kernel launches of a decode step into one.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from aioworker.compute.layers.attention import AttentionContext
from aioworker.compute.layers.attention.cuda_backend import CudaAttentionMetadata, DecodePart
from aioworker.compute.layers.attention.triton_decode import choose_num_splits


def decode_forward(runner, token_ids, positions, rows, num_splits: int) -> torch.Tensor:
    """Logits [B, V] for one decode token per row; every tensor op here is graph-safe."""
    block_size = runner.block_size
    block_tables = runner.block_table_matrix.index_select(0, rows)  # [B, max_blocks]
    blocks = block_tables.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1).long()
    slot_mapping = blocks * block_size + positions % block_size
    context_lens = (positions + 1).to(torch.int32)
    token_ids = runner.with_pending_tokens(token_ids, rows)
    meta = CudaAttentionMetadata(
        slot_mapping, DecodePart(None, block_tables, context_lens, num_splits), None
    )
    hidden = runner.model(token_ids, positions, AttentionContext(runner.backend, meta))
    return runner.model.compute_logits(hidden)


def capture_sizes(max_batch: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, runner, max_batch: int, max_model_len: int) -> None:
        self.runner = runner
        self.max_batch = max_batch
        self.sizes = capture_sizes(max_batch)
        device = runner.device
        self.token_ids = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.rows = torch.full((max_batch,), runner.scratch_row, dtype=torch.int64, device=device)
        # A ring of pinned staging buffers: while one step's copies wait behind steps still on
        # the GPU, the next step must not overwrite them (two steps are in flight, one prepared).
        self.staging = [
            torch.zeros(3, max_batch, dtype=torch.int64, pin_memory=True) for _ in range(4)
        ]
        self.num_runs = 0
        self.splits = {
            size: choose_num_splits(size, runner.num_kv_heads, max_model_len, runner.num_sms)
            for size in self.sizes
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool."""
        pool = None
        for size in reversed(self.sizes):
            args = (
                self.token_ids[:size],
                self.positions[:size],
                self.rows[:size],
                self.splits[size],
            )
            for _ in range(2):  # compile and warm the kernels outside the capture
                decode_forward(self.runner, *args)
            torch.cuda.synchronize(self.runner.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = decode_forward(self.runner, *args)
            pool = graph.pool()
            self.graphs[size] = graph

    def run(self, token_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """Logits [n, V] for n decode rows; n must not exceed max_batch."""
        n = len(token_ids)
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        staging = self.staging[self.num_runs % len(self.staging)]
        self.num_runs += 1
        staged = staging.numpy()
        staged[0, :n], staged[1, :n], staged[2, :n] = token_ids, positions, rows
        staged[0, n:size], staged[1, n:size], staged[2, n:size] = 0, 0, self.runner.scratch_row
        self.token_ids[:size].copy_(staging[0, :size], non_blocking=True)
        self.positions[:size].copy_(staging[1, :size], non_blocking=True)
        self.rows[:size].copy_(staging[2, :size], non_blocking=True)
        self.graphs[size].replay()
        return self.logits[size][:n]
