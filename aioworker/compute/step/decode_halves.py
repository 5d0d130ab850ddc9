"""A large decode step's layers run as two halves of its sequences on two CUDA streams
(device.decode_halves_from).

Why: a decode step of a few hundred sequences is mostly decode attention, which reads the KV
cache at close to the copy rate, and a tail of short kernels (the products on a few hundred
rows, the norms, SiLU) that each take several microseconds of latency and leave the memory
idle. Run as two independent chains, one half's short kernels can run while the other half's
attention reads (the kernels of a captured graph's two branches run concurrently), so the
step may take less than the sum of its parts. The halves end in one hidden-state tensor and
one LM head, so the head's weights are read once.

Where it is safe: the two chains share nothing they write. Each half writes its own sequences'
KV (the padded rows of a graph write only the scratch block, which nothing reads as data). The
few-rows kernels (1 to MAX_ROWS rows) count arrivals in one buffer per device that assumes one
kernel at a time (layers/arrivals.py), so a half must have more rows than they take
(`takes`). Two streams would also issue collectives out of order across ranks, and MoE layers
add to their load counters: the rank builder switches halves off for tensor parallelism and
MoE models.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from aioworker.compute.layers.gemv.tiles import MAX_ROWS

# (token_ids [B], positions [B], block-table rows [B], query counts (None: one each), split
# count) -> final hidden states [B, D]
HiddenOf = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, None, int], torch.Tensor]

# A half must have more rows than the few-rows kernels take.
MIN_BATCH = 2 * (MAX_ROWS + 1)


class DecodeHalves:
    def __init__(
        self, from_batch: int, num_splits: Callable[[int], int], device: torch.device
    ) -> None:
        """`from_batch`: decode batches (graph sizes, padding included) of at least this many
        sequences run in halves, never fewer than MIN_BATCH; 0: none. `num_splits`: decode
        attention's split count for a batch size (each half's own)."""
        self.from_batch = max(from_batch, MIN_BATCH) if from_batch else 0
        self.num_splits = num_splits
        # On the CPU (tests) the halves run one after the other: the same arithmetic.
        on_cuda = self.from_batch and device.type == "cuda"
        self.side = torch.cuda.Stream(device) if on_cuda else None

    def takes(self, batch: int, queries: int) -> bool:
        """Whether a step of `batch` sequences of `queries` query slots each runs in halves:
        decode steps (one query each) only; verify steps keep one chain."""
        return self.from_batch > 0 and queries == 1 and batch >= self.from_batch

    def hidden(
        self, hidden_of: HiddenOf, token_ids: torch.Tensor, positions: torch.Tensor, rows
    ) -> torch.Tensor:
        """The final hidden states of every sequence, the first half's chain on the current
        stream and the second's on the side stream, joined before returning."""
        half = rows.shape[0] // 2
        first, second = slice(0, half), slice(half, None)

        def chain(part: slice) -> torch.Tensor:
            size = len(rows[part])
            return hidden_of(
                token_ids[part], positions[part], rows[part], None, self.num_splits(size)
            )

        if self.side is None:
            return torch.cat([chain(first), chain(second)])
        main = torch.cuda.current_stream(rows.device)
        self.side.wait_stream(main)  # the step's inputs, copied on the main stream
        head = chain(first)
        with torch.cuda.stream(self.side):
            tail = chain(second)
        # The side stream rejoins before anything reads its half: a capture requires it, and
        # the next step's side-stream work then waits behind this step's whole.
        main.wait_stream(self.side)
        return torch.cat([head, tail])
