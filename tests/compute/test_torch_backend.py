"""The torch attention backend's prefill: right answers, through torch's fused CPU kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from aioworker.compute.layers.attention.torch_backend import PrefillChunk, TorchAttentionBackend

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context", [0, 24])
def test_a_prefill_chunk_is_causal_attention_over_its_context(dtype, context) -> None:
    n = 16
    q, k, v, cache_k, cache_v, slots, mask = chunk_inputs(n, context or n, dtype)
    if context:
        chunk = PrefillChunk(0, n, slots, mask)
        keys, values = cache_k[:, slots], cache_v[:, slots]
    else:
        chunk = PrefillChunk(0, n, None, None)
        keys, values = k.transpose(0, 1), v.transpose(0, 1)
    got = TorchAttentionBackend._prefill(q, k, v, cache_k, cache_v, chunk, SCALE)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(
        got.float(), reference(q, keys, values, mask), atol=tolerance, rtol=0
    )


@pytest.mark.parametrize("context", [0, 24])
def test_prefill_runs_torchs_fused_cpu_kernel(context) -> None:
    """The unfused math path (3-D inputs reach it) took twice as long in bf16."""
    n = 16
    q, k, v, cache_k, cache_v, slots, mask = chunk_inputs(n, context or n, torch.bfloat16)
    chunk = PrefillChunk(0, n, slots, mask) if context else PrefillChunk(0, n, None, None)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        TorchAttentionBackend._prefill(q, k, v, cache_k, cache_v, chunk, SCALE)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops
