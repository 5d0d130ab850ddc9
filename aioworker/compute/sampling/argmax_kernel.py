"""Greedy tokens of a few rows in two short launches (Triton): each program takes the maximum of
one chunk of a row, then one program a row picks the best chunk.

torch's argmax reduces a row of a batch-1 step in one block: on the H200 that took 24-27 us for
the 8B's 128,256 logits (tools/profile_step.py, docs/benchmarks.md), about 1% of a token. Here
a row is read by ~128 programs at once. Ties go to the lowest token id, as torch's argmax breaks
them: within a chunk tl.argmax takes the first of equal values, and across chunks the second
launch takes the first chunk holding the maximum. The logits are read as they are (bf16, fp16
or float32): widening is exact, so their argmax is the float32 argmax. NaN is ordered as torch
orders it, above everything: a row holding one gets its first NaN's id. A model that makes NaN is
broken either way, but the id must stay a token: the first version left NaN to the comparisons,
and a row of NaN logits got an id past the vocabulary (a masked lane's), which the next step's
embedding lookup failed on with a device-side assert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 1024  # logits a program of the first launch reads
MAX_ROWS = 16  # past this, torch's argmax has a block for every row and is fast enough
MIN_VOCAB = 4 * CHUNK  # a row shorter than this is one block's work anyway


@triton.jit
def _first_max(x, AXIS: tl.constexpr):
    """(the maximum of x along AXIS, its first index), NaN above everything, as torch's argmax
    has it: where x holds a NaN, (NaN, the first NaN's index)."""
    nan = x != x
    any_nan = tl.max(nan.to(tl.int32), AXIS) > 0
    first_nan = tl.argmax(nan.to(tl.int32), AXIS)  # ties go to the first index
    ordered = tl.where(nan, float("-inf"), x)
    best = tl.where(any_nan, float("nan"), tl.max(ordered, AXIS))
    return best, tl.where(any_nan, first_nan, tl.argmax(ordered, AXIS))


@triton.jit
def _chunk_maxima(x_ptr, stride_row, vocab, best_ptr, where_ptr, chunks, CHUNK: tl.constexpr):
    row, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf"))
    best, first = _first_max(x.to(tl.float32), 0)
    tl.store(best_ptr + row * chunks + chunk, best)
    tl.store(where_ptr + row * chunks + chunk, chunk * CHUNK + first.to(tl.int32))


@triton.jit
def _best_chunk(best_ptr, where_ptr, chunks, out_ptr, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, CHUNKS)
    best = tl.load(best_ptr + row * chunks + lanes, mask=lanes < chunks, other=float("-inf"))
    _, first = _first_max(best, 0)
    tl.store(out_ptr + row, tl.load(where_ptr + row * chunks + first).to(tl.int64))


def takes(logits: torch.Tensor) -> bool:
    """Where the two launches beat torch's argmax: a few long rows, each contiguous."""
    rows, vocab = logits.shape
    return 1 <= rows <= MAX_ROWS and vocab >= MIN_VOCAB and logits.stride(1) == 1


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (R <= MAX_ROWS, rows contiguous) -> each row's first maximal token id [R]
    int64, as torch.argmax(logits, dim=-1)."""
    rows, vocab = logits.shape
    if not takes(logits):
        raise ValueError(
            f"argmax_rows takes 1 to {MAX_ROWS} contiguous rows of at least {MIN_VOCAB} logits, "
            f"not {tuple(logits.shape)} with strides {logits.stride()}; use torch.argmax"
        )
    chunks = triton.cdiv(vocab, CHUNK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    where = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    _chunk_maxima[(rows, chunks)](logits, logits.stride(0), vocab, best, where, chunks,
                                  CHUNK=CHUNK, num_warps=4)  # fmt: skip
    _best_chunk[(rows,)](best, where, chunks, out, CHUNKS=triton.next_power_of_2(chunks),
                         num_warps=4)  # fmt: skip
    return out
