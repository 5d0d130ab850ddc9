"""A large decode step's layers run as two halves of its sequences on two CUDA streams
(device.decode_halves_from).

Why: a decode step of a few hundred sequences is mostly decode attention, which reads the KV
cache at close to the copy rate, and a tail of short kernels (the products on a few hundred
rows, the norms, SiLU) that each take several microseconds of latency and leave the memory
idle. Run as two independent chains, one half's tail can run while the other half's attention
reads (the kernels of a captured graph's two branches run concurrently), so the step may take
less than the sum of its parts. The halves end in one hidden-state tensor and one LM head, so
the head's weights are read once.

The second chain starts when the first has launched its first layer's attention, not with it.
Two chains started together could stay in step: both attending at once (sharing the memory),
then both running their tails at once, which is one chain's schedule again. Started half a
layer apart, each chain's tail should fall in the other's attention. That is reasoning, not a
measurement; whether the halves pay at all is for W1 on a GPU to say (docs/benchmarks.md).

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
# count, attention backend) -> final hidden states [B, D]
HiddenOf = Callable[..., torch.Tensor]

# A half must have more rows than the few-rows kernels take.
MIN_BATCH = 2 * (MAX_ROWS + 1)


class DecodeHalves:
    def __init__(
        self, from_batch: int, num_splits: Callable[[int], int], backend, device: torch.device
    ) -> None:
        """`from_batch`: decode batches (graph sizes, padding included) of at least this many
        sequences run in halves, never fewer than MIN_BATCH; 0: none. `num_splits`: decode
        attention's split count for a batch size (each half's own). `backend`: the attention
        backend the chains attend through."""
        self.from_batch = max(from_batch, MIN_BATCH) if from_batch else 0
        self.num_splits = num_splits
        self.backend = backend
        # On the CPU (tests) the halves run one after the other: the same arithmetic.
        on_cuda = self.from_batch and device.type == "cuda"
        self.side = torch.cuda.Stream(device) if on_cuda else None
        # Made once, outside any capture; each step (or capture) records it again.
        self.first_attended = torch.cuda.Event() if on_cuda else None

    def takes(self, batch: int, queries: int) -> bool:
        """Whether a step of `batch` sequences of `queries` query slots each runs in halves:
        decode steps (one query each) only; verify steps keep one chain."""
        return self.from_batch > 0 and queries == 1 and batch >= self.from_batch

    def hidden(
        self, hidden_of: HiddenOf, token_ids: torch.Tensor, positions: torch.Tensor, rows
    ) -> torch.Tensor:
        """The final hidden states of every sequence: the first half's chain on the current
        stream, the second's on the side stream from the first's first attention, joined
        before returning."""
        half = rows.shape[0] // 2
        first, second = slice(0, half), slice(half, None)

        def chain(part: slice, backend) -> torch.Tensor:
            splits = self.num_splits(len(rows[part]))
            return hidden_of(token_ids[part], positions[part], rows[part], None, splits, backend)

        head = chain(first, MarksFirstAttention(self.backend, self.first_attended))
        if self.side is None:
            return torch.cat([head, chain(second, self.backend)])
        with torch.cuda.stream(self.side):
            # After the step's inputs too: they were copied on the main stream before.
            self.side.wait_event(self.first_attended)
            tail = chain(second, self.backend)
        # The side stream rejoins before anything reads its half: a capture requires it, and
        # the next step's side-stream work then waits behind this step's whole.
        torch.cuda.current_stream(rows.device).wait_stream(self.side)
        return torch.cat([head, tail])


class MarksFirstAttention:
    """An attention backend as it is, but the first attention through it records `event` on
    the stream it runs on (None: records nothing)."""

    def __init__(self, backend, event: torch.cuda.Event | None) -> None:
        self.backend = backend
        self.event = event

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def attend(self, *args):
        attend = getattr(self.backend, "attend", None)
        return self._marked(attend(*args) if attend is not None else None)

    def forward(self, *args):
        return self._marked(self.backend.forward(*args))

    def _marked(self, out):
        if out is not None and self.event is not None:
            self.event.record()
            self.event = None  # the first attention only
        return out
