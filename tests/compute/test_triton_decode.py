"""The Triton paged decode kernel against a float64 reference. On a CPU machine it runs in
Triton's interpreter (slow, so sizes are small); on the GPU machine, for real (-m gpu too)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from aioworker.compute.layers.attention.triton_decode import (  # noqa: E402
    TILE_N,
    DecodeBuild,
    paged_decode,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, k_cache, v_cache, block_tables, context_lens, scale):
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty(batch, num_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        length = int(context_lens[b])
        blocks = block_tables[b, : -(-length // block_size)].long().cpu()
        keys = k_cache.cpu()[blocks].reshape(-1, num_kv_heads, head_dim)[:length].double()
        values = v_cache.cpu()[blocks].reshape(-1, num_kv_heads, head_dim)[:length].double()
        for h in range(num_heads):
            scores = keys[:, h // group] @ q[b, h].cpu().double() * scale
            out[b, h] = torch.softmax(scores, 0) @ values[:, h // group]
    return out


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "num_splits", "dtype"),
    [
        (4, 2, 64, 16, 1, torch.float32),
        (9, 3, 64, 16, 3, torch.float32),
        (8, 1, 32, 32, 2, torch.float32),
        pytest.param(
            4,
            4,
            64,
            16,
            1,
            torch.bfloat16,
            marks=pytest.mark.skipif(
                DEVICE == "cpu", reason="Triton's interpreter does not emulate bf16 dots faithfully"
            ),
        ),
        pytest.param(
            8,
            2,
            128,
            16,
            4,
            torch.bfloat16,
            marks=pytest.mark.skipif(DEVICE == "cpu", reason="bf16: GPU only"),
        ),
    ],
)
def test_paged_decode_matches_reference(
    num_heads, num_kv_heads, head_dim, block_size, num_splits, dtype
) -> None:
    generator = torch.Generator().manual_seed(num_heads * 100 + num_splits)
    num_blocks = 64
    context_lens = torch.tensor([1, TILE_N + 5, 3 * TILE_N, 17], dtype=torch.int32)
    batch = len(context_lens)
    max_blocks = -(-int(context_lens.max()) // block_size)
    # Every sequence gets distinct, shuffled blocks, so a wrong gather cannot pass.
    block_tables = torch.randperm(num_blocks, generator=generator)[: batch * max_blocks].view(
        batch, max_blocks
    )
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    q = torch.randn(batch, num_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5
    expected = reference(q, k_cache, v_cache, block_tables, context_lens, scale)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    out = paged_decode(
        to(q), to(k_cache), to(v_cache), to(block_tables.int()), to(context_lens), scale, num_splits
    )
    error = ((out.double().cpu() - expected).norm() / expected.norm()).item()
    assert error < (1e-5 if dtype == torch.float32 else 1e-2), error


@pytest.mark.parametrize(("tile_n", "heads_first", "num_splits"), [(32, True, 1), (16, False, 3)])
def test_other_builds_of_the_kernel_give_the_reference(tile_n, heads_first, num_splits) -> None:
    """Other builds (keys a tile, the grid's order): the reference's output, tiles and splits
    crossing the sequences' ends."""
    generator = torch.Generator().manual_seed(tile_n + num_splits)
    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 32, 16
    context_lens, _, block_tables = sequences(generator, None, block_size)
    shape = (64, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator)
    v_cache = torch.randn(shape, generator=generator)
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=generator)
    expected = reference(q, k_cache, v_cache, block_tables, context_lens, head_dim**-0.5)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    out = paged_decode(
        to(q), to(k_cache), to(v_cache), to(block_tables.int()), to(context_lens),
        head_dim**-0.5, num_splits, build=DecodeBuild(tile=tile_n, heads_first=heads_first),
    )  # fmt: skip
    error = ((out.double().cpu() - expected).norm() / expected.norm()).item()
    assert error < 1e-5, error


@pytest.mark.parametrize(
    ("num_splits", "build"),
    [
        (1, DecodeBuild()),
        (3, DecodeBuild()),
        (3, DecodeBuild(tile=32, heads_first=True)),
        # the large steps' build (device.decode_attention_tile_128_from_programs)
        (2, DecodeBuild(tile=128)),
    ],
)
def test_several_queries_per_sequence_see_the_context_up_to_their_own_position(
    num_splits, build
) -> None:
    """A verify step's rows: each query token of a sequence attends causally, like a decode of
    its own position (the reference, row by row), in the default build and another."""
    generator = torch.Generator().manual_seed(7 + num_splits)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 8, 2, 32, 16, 64
    context_lens = torch.tensor([5, TILE_N + 5, 3 * TILE_N, 17], dtype=torch.int32)
    query_lens = torch.tensor([1, 5, 3, 8], dtype=torch.int32)
    batch, max_blocks = len(context_lens), -(-int(context_lens.max()) // block_size)
    block_tables = torch.randperm(num_blocks, generator=generator)[: batch * max_blocks].view(
        batch, max_blocks
    )
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator)
    v_cache = torch.randn(shape, generator=generator)
    q = torch.randn(int(query_lens.sum()), num_heads, head_dim, generator=generator)
    scale = head_dim**-0.5
    # Row by row: query j of a sequence with n queries sees context_len - n + 1 + j positions.
    row_seq = torch.repeat_interleave(torch.arange(batch), query_lens.long())
    starts = torch.cumsum(query_lens, 0) - query_lens
    row_query = torch.arange(len(q)) - starts[row_seq]
    row_lens = context_lens[row_seq] - query_lens[row_seq] + 1 + row_query
    expected = reference(q, k_cache, v_cache, block_tables[row_seq], row_lens, scale)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    queries = (to(starts.int()), to(query_lens), int(query_lens.max()))
    out = paged_decode(
        to(q), to(k_cache), to(v_cache), to(block_tables.int()), to(context_lens), scale,
        num_splits, queries=queries, build=build,
    )  # fmt: skip
    error = ((out.double().cpu() - expected).norm() / expected.norm()).item()
    assert error < 1e-5, error


def sequences(g: torch.Generator, query_lens: list[int] | None, block_size=16, num_blocks=64):
    """Four sequences of 5, TILE_N + 5, 3 TILE_N and 17 tokens, their query counts (one each
    where None) and block tables of distinct, shuffled blocks."""
    context_lens = torch.tensor([5, TILE_N + 5, 3 * TILE_N, 17], dtype=torch.int32)
    query_lens = torch.tensor(query_lens or [1] * 4, dtype=torch.int32)
    batch, max_blocks = len(context_lens), -(-int(context_lens.max()) // block_size)
    block_tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].view(batch, -1)
    return context_lens, query_lens, block_tables


@pytest.mark.parametrize(("num_splits", "multi", "with_norm"),
                         [(1, False, False), (3, False, True), (3, True, False), (2, True, True)])  # fmt: skip
def test_rope_in_equals_the_rope_and_cache_kernel_then_decode(num_splits, multi, with_norm) -> None:
    """Raw q, k and v given to the decode kernel (rope_in): the same output, and the same cache,
    as qkv_rope_cache_ writing the cache first. A verify step's new tokens may cross a tile and
    a split (sequence 1: positions TILE_N .. TILE_N + 4)."""
    from aioworker.compute.layers import fused
    from aioworker.compute.layers.attention.triton_decode import RopeIn

    g = torch.Generator().manual_seed(21 + num_splits)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 8, 2, 32, 16, 64
    context_lens, query_lens, block_tables = sequences(g, [1, 5, 3, 8] if multi else None)
    batch = len(context_lens)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    rows = int(query_lens.sum())
    qkv = torch.randn(rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=g)
    cos, sin = torch.randn(rows, head_dim, generator=g), torch.randn(rows, head_dim, generator=g)
    q_weight = torch.rand(head_dim, generator=g) + 0.5 if with_norm else None
    k_weight = torch.rand(head_dim, generator=g) + 0.5 if with_norm else None
    # Each new token's cache slot, from its position and the block table.
    row_seq = torch.repeat_interleave(torch.arange(batch), query_lens.long())
    starts = torch.cumsum(query_lens, 0) - query_lens
    positions = context_lens[row_seq] - query_lens[row_seq] + torch.arange(rows) - starts[row_seq]
    slots = block_tables[row_seq, positions // block_size] * block_size + positions % block_size
    to = lambda t: t.to(DEVICE)  # noqa: E731
    queries = (to(starts.int()), to(query_lens), int(query_lens.max())) if multi else None
    outputs, caches = [], []
    for fused_in in (False, True):
        q, k, v = (
            t.view(rows, -1, head_dim)
            for t in to(qkv.clone()).split([num_heads * head_dim, num_kv_heads * head_dim,
                                           num_kv_heads * head_dim], dim=-1)
        )  # fmt: skip
        kc, vc = to(k_cache.clone()), to(k_cache.clone() * 0.5)
        weights = [None if w is None else to(w) for w in (q_weight, k_weight)]
        rope_in = RopeIn(k, v, to(cos), to(sin), *weights, 1e-6) if fused_in else None
        if not fused_in:
            fused.qkv_rope_cache_(q, k, v, to(cos), to(sin), *weights, 1e-6, kc, vc, to(slots))
        out = paged_decode(q, kc, vc, to(block_tables.int()), to(context_lens), head_dim**-0.5,
                           num_splits, queries=queries, rope_in=rope_in)  # fmt: skip
        outputs.append(out.cpu())
        caches.append((kc.cpu(), vc.cpu()))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    # The same bits under the interpreter; on a GPU the norm's sum over a head may add in
    # another order for a block of rows than for one head: the last bit may differ.
    exact = DEVICE == "cpu" or not with_norm
    tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-6, "atol": 1e-6}
    for got, want in zip(caches[1], caches[0], strict=True):
        torch.testing.assert_close(got, want, **tolerance)
