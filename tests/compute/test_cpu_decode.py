"""The CPU paged decode kernel (cpu_decode.c) against attention computed in float64 from the
same cache: head sizes with and without their own code path, query groups, windows, lengths that
end on and off a block, in float32 and bf16; and the model gives the same tokens with it as
without it."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.layers.attention import cpu_decode
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine

BLOCK = 16


@pytest.fixture(scope="module")
def kernel() -> cpu_decode.PagedDecode:
    built = cpu_decode.load()
    assert built is not None, "the CPU decode kernel did not build: is a C compiler installed?"
    return built


def reference(q, k_cache, v_cache, block_table, lengths, scale, window):
    batch, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[0]
    out = torch.empty(batch, num_heads, head_dim, dtype=torch.float64)
    for b, length in enumerate(lengths.tolist()):
        positions = torch.arange(max(0, length - window) if window else 0, length)
        slots = block_table[b][positions // BLOCK] * BLOCK + positions % BLOCK
        for h in range(num_heads):
            keys = k_cache[h // group].reshape(-1, head_dim)[slots].double()
            values = v_cache[h // group].reshape(-1, head_dim)[slots].double()
            out[b, h] = ((q[b, h].double() @ keys.T) * scale).softmax(-1) @ values
    return out


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize(
    "head_dim, num_kv_heads, group, window",
    [(64, 3, 3, 0), (128, 2, 4, 0), (96, 2, 1, 0), (64, 1, 8, 20)],
)
def test_the_kernel_equals_attention_in_float64(
    kernel, dtype, tolerance, head_dim, num_kv_heads, group, window
) -> None:
    generator = torch.Generator().manual_seed(head_dim + group)
    num_blocks, max_blocks = 64, 6
    lengths = torch.tensor([1, 15, 16, 17, 50, max_blocks * BLOCK])
    shape = (num_kv_heads, num_blocks, BLOCK, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    block_table = torch.randperm(num_blocks, generator=generator)[: len(lengths) * max_blocks]
    block_table = block_table.view(len(lengths), max_blocks).contiguous()
    q = torch.randn(len(lengths), num_kv_heads * group, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5
    assert kernel.serves(dtype, q.shape[1], num_kv_heads, head_dim)
    out = kernel(q, k_cache, v_cache, block_table, lengths, int(lengths.max()), scale, window)
    expected = reference(q, k_cache, v_cache, block_table, lengths, scale, window)
    assert (out.double() - expected).abs().max().item() <= tolerance


def test_shapes_it_was_not_written_for_are_left_to_torch(kernel) -> None:
    assert not kernel.serves(torch.float16, 8, 2, 64)
    assert not kernel.serves(torch.float32, 8, 2, 72)  # not whole 16-float vectors
    assert not kernel.serves(torch.float32, 64, 1, 64)  # 64 query heads to a kv head


@pytest.mark.slow
def test_the_embedded_model_decodes_the_same_tokens_with_and_without_the_kernel(
    embedded_model_dir, kernel
) -> None:
    prompts = [list(range(100, 100 + n)) for n in (5, 33, 70)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tokens = {}
    for backend in ("auto", "torch"):
        with make_engine(embedded_model_dir, **{"device.attention_backend": backend}) as engine:
            decode_kernel = engine.executor.runner.backend.decode_kernel
            assert (decode_kernel is not None) == (backend == "auto")
            tokens[backend] = [c.token_ids for c in engine.generate(prompts, greedy)]
    assert tokens["auto"] == tokens["torch"]
