"""The torch attention backend's prefill: right answers, through torch's fused CPU kernel, for
chunks over cached context and for fresh prompts batched by length among decodes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from aioworker.compute.layers.attention.slots import SeqSlots
from aioworker.compute.layers.attention.torch_backend import (
    PrefillChunk,
    TorchAttentionBackend,
    _fresh_prefill,
)

HEADS, KV_HEADS, HEAD_DIM, SCALE = 6, 2, 32, 32**-0.5


def reference(q, keys, values, mask):
    """Float32 attention with every query head given its own copy of its KV head."""
    repeat = HEADS // KV_HEADS
    keys, values = (t.float().repeat_interleave(repeat, 0) for t in (keys, values))
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), keys, values, attn_mask=mask, scale=SCALE
    )
    return out.transpose(0, 1)


def chunk_inputs(n: int, context: int, dtype: torch.dtype):
    """A chunk of n queries whose context (its own keys last) lies in a head-outer cache."""
    gen = torch.Generator().manual_seed(n + context)
    q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype)
    cache_k = torch.randn(KV_HEADS, 64, HEAD_DIM, generator=gen).to(dtype)
    cache_v = torch.randn(KV_HEADS, 64, HEAD_DIM, generator=gen).to(dtype)
    slots = torch.randperm(64, generator=gen)[:context]
    k = cache_k[:, slots[-n:]].transpose(0, 1)
    v = cache_v[:, slots[-n:]].transpose(0, 1)
    query_pos = torch.arange(context - n, context)[:, None]
    mask = torch.arange(context)[None, :] <= query_pos
    return q, k, v, cache_k, cache_v, slots, mask


def prefill(q, k, v, cache_k, cache_v, slots, mask, context: int) -> torch.Tensor:
    """A chunk over cached context, or (context 0) a fresh prompt as one of a batch of one."""
    if context:
        return TorchAttentionBackend._prefill(
            cache_k, cache_v, q, PrefillChunk(0, len(q), slots, mask), SCALE
        )
    return _fresh_prefill(q, k, v, torch.arange(len(q))[None, :], SCALE)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context", [0, 24])
def test_a_prefill_chunk_is_causal_attention_over_its_context(dtype, context) -> None:
    n = 16
    q, k, v, cache_k, cache_v, slots, mask = chunk_inputs(n, context or n, dtype)
    got = prefill(q, k, v, cache_k, cache_v, slots, mask, context)
    keys, values = cache_k[:, slots], cache_v[:, slots]
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(
        got.float(), reference(q, keys, values, mask), atol=tolerance, rtol=0
    )


@pytest.mark.parametrize("context", [0, 24])
def test_prefill_runs_torchs_fused_cpu_kernel(context) -> None:
    """The unfused math path (3-D inputs reach it) took twice as long in bf16."""
    n = 16
    q, k, v, cache_k, cache_v, slots, mask = chunk_inputs(n, context or n, torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill(q, k, v, cache_k, cache_v, slots, mask, context)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


def test_fresh_prompts_among_decodes_are_batched_by_length_and_each_attends_to_itself() -> None:
    """Two 3-token and one 5-token fresh prompt between decodes: one call per length, and each
    prompt's rows equal causal attention over that prompt alone."""
    block_size, gen = 4, torch.Generator().manual_seed(3)
    seqs = [
        SeqSlots(3, 0, [0]),
        SeqSlots(1, 6, [1, 2]),
        SeqSlots(5, 0, [3, 4]),
        SeqSlots(3, 0, [5]),
        SeqSlots(1, 2, [6]),
    ]
    backend = TorchAttentionBackend(block_size, sliding_window=None)
    meta = backend.build_metadata(seqs, torch.device("cpu"))
    assert sorted(group.num_tokens for group in meta.fresh) == [3, 5] and not meta.prefills
    total = sum(s.num_tokens for s in seqs)
    q = torch.randn(total, HEADS, HEAD_DIM, generator=gen)
    k, v = (torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    k_cache, v_cache = (
        torch.randn(KV_HEADS, 8, block_size, HEAD_DIM, generator=gen) for _ in range(2)
    )
    out = backend.forward(q, k, v, k_cache, v_cache, meta, SCALE)
    for start, n in ((0, 3), (4, 5), (9, 3)):
        rows = slice(start, start + n)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        expected = reference(q[rows], k[rows].transpose(0, 1), v[rows].transpose(0, 1), causal)
        torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=0)
