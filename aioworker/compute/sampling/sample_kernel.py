"""Sampling of every row of a batch in one launch (Triton): argmax over (logit - log E), with
E ~ Exp(1) drawn per (row key, token id) by Philox.

That is the same draw as argmax(p / E) (token i with probability p_i), without the softmax, and
with each row's noise a pure function of its 63-bit key. A seeded row's key derives from (seed,
position), so its token depends on nothing else in the batch. torch needs a generator per
seeded row for that: at 256 seeded rows (one GRPO batch) that is 256 generators and 256
launches a step, milliseconds of host time that every step waits on. Here the keys are one
small copy and the draw one pass over the logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _draw_rows(x_ptr, stride_row, vocab, keys_ptr, out_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + row)
    lanes = tl.arange(0, BLOCK)
    best_score = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    best_id = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    for start in range(0, vocab, BLOCK):
        ids = start + lanes
        x = tl.load(x_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf"))
        bits = tl.randint(key, ids).to(tl.uint32, bitcast=True)
        # 23 random bits + 1/2: u lies strictly inside (0, 1), so E = -log(u) > 0 (clamped,
        # in case an approximate log rounds it to 0 near u = 1).
        u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        noise = tl.maximum(-tl.log(u), 1e-30)
        score = x - tl.log(noise)
        tile_best = tl.max(score, 0)
        tile_id = start + tl.argmax(score, 0)
        better = tile_best > best_score
        best_id = tl.where(better, tile_id, best_id)
        best_score = tl.where(better, tile_best, best_score)
    tl.store(out_ptr + row, best_id.to(tl.int64))


def draw_rows(scaled: torch.Tensor, keys: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """scaled: [R, V] float32 logits / temperature (-inf where top-k/top-p cut); keys: [R]
    int64 in [0, 2**63). Returns the sampled token ids [R] int64. `block`: the widest tile
    (a power of two; small vocabularies take a smaller one)."""
    rows, vocab = scaled.shape
    block = min(block, max(16, triton.next_power_of_2(vocab)))
    assert scaled.stride(1) == 1, "each row's logits must be contiguous"
    out = torch.empty(rows, dtype=torch.int64, device=scaled.device)
    if rows:
        _draw_rows[(rows,)](scaled, scaled.stride(0), vocab, keys, out, BLOCK=block, num_warps=8)
    return out
