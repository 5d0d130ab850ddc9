"""Paged decode attention in Triton: a few query tokens per sequence (one for a decode, up to
MAX_QUERIES for a step verifying drafts) against its cached context.

Each program takes one (sequence, KV head, split of the context) and all the query heads that
share that KV head, for every query token of the sequence, so every K/V byte is read once per
group (GQA) and once for all of a verify step's queries: its rows are (query j, head g), query j
seeing the context up to its own position (the sequence's last q positions are its queries,
their K/V already written). Keys are visited in tiles of TILE_N tokens gathered from the block
table; an online softmax keeps the running max and sum. With several splits, a second small
kernel merges each query row's partial results by their log-sum-exp (split_merge.py).

With `rope_in` (a decode step's attention given its raw q, k and v), the kernel also does what
fused.qkv_rope_cache_ does before it, so that it needs no launch of its own: each program
norms and rotates its query rows as it loads them, and writes the step's new keys (normed and
rotated) and values into the cache where they fall in its own split of the context, before it
reads that split. No other program reads those positions, so a barrier within the program is
all the ordering needed.

Cache layout: [num_blocks, block_size, num_kv_heads, head_dim], any block size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aioworker.compute.layers.attention.split_merge import merge_splits
from aioworker.compute.layers.fused import norm_rope_rows
from aioworker.compute.layers.gdc import wait_for_previous_kernel
from aioworker.compute.layers.pdl import launch_options


@dataclass(frozen=True)
class RopeIn:
    """A decode step's raw k and v ([T, Hkv, D] views of the qkv product, head dim contiguous,
    sharing their token stride with q), the rotary tables (float32 [T, D]) and the optional
    per-head norms' weights (Qwen3): the kernel norms and rotates q and k itself and writes k
    and v to the cache."""

    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q_weight: torch.Tensor | None
    k_weight: torch.Tensor | None
    eps: float


@triton.jit
def _decode_partial(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_starts_ptr,
    query_lens_ptr,
    out_ptr,
    lse_ptr,
    scale,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    stride_o_split,
    stride_l_seq,
    stride_l_head,
    num_splits,
    k_new_ptr,
    v_new_ptr,
    cos_ptr,
    sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    stride_new_seq,
    stride_cos,
    eps,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    MULTI: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    ROPE_IN: tl.constexpr,
    HAS_NORM: tl.constexpr,
    QUERIES_P2: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    if HEADS_FIRST:  # a sequence's KV heads in neighbouring programs: they read the same rows
        kv_head = tl.program_id(0)
        seq = tl.program_id(1)
    else:
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    num_tiles = tl.cdiv(context_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_start = split * tiles_per_split
    tile_end = tl.minimum(tile_start + tiles_per_split, num_tiles)

    if MULTI:
        query_start = tl.load(query_starts_ptr + seq)
        num_queries = tl.load(query_lens_ptr + seq)
    else:
        query_start, num_queries = seq, 1
    offs_r = tl.arange(0, ROWS_PAD)  # row r: query r // GROUP_P2, head r % GROUP_P2
    query = offs_r // GROUP_P2
    offs_g = offs_r % GROUP_P2
    row_ok = (offs_g < GROUP) & (query < num_queries)
    # Query j sees positions below this: the context up to and including its own position.
    limit = context_len - num_queries + 1 + query
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, TILE_N)
    heads = kv_head * GROUP + offs_g
    token = query_start + query
    q_rows = q_ptr + token[:, None] * stride_q_seq + heads[:, None] * stride_q_head
    table = block_tables_ptr + seq * stride_bt_seq
    if ROPE_IN:
        q = norm_rope_rows(
            q_rows, cos_ptr + token[:, None] * stride_cos, sin_ptr + token[:, None] * stride_cos,
            q_norm_ptr, eps, row_ok[:, None], HEAD_DIM, HAS_NORM,
        )  # fmt: skip
        _write_new_kv(
            k_new_ptr, v_new_ptr, cos_ptr, sin_ptr, k_norm_ptr, eps, k_cache_ptr, v_cache_ptr,
            table, kv_head, query_start, num_queries, context_len, tile_start * TILE_N,
            tile_end * TILE_N, stride_new_seq, stride_cos, stride_k_block, stride_k_slot,
            stride_k_head, HEAD_DIM, BLOCK_SIZE, HAS_NORM, QUERIES_P2,
        )  # fmt: skip
        tl.debug_barrier()  # this program's writes, before it reads them back below
    else:
        q = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [R, D]

    m = tl.full([ROWS_PAD], float("-inf"), tl.float32)  # running max
    total = tl.zeros([ROWS_PAD], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([ROWS_PAD, HEAD_DIM], tl.float32)
    for tile in range(tile_start, tile_end):
        pos = tile * TILE_N + offs_n
        valid = pos < context_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0)
        row = block.to(tl.int64) * stride_k_block + (pos % BLOCK_SIZE) * stride_k_slot
        kv_offs = row[:, None] + kv_head * stride_k_head + offs_d[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=valid[:, None], other=0.0)  # [N, D]
        v = tl.load(v_cache_ptr + kv_offs, mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [R, N]
        scores = tl.where(pos[None, :] < limit[:, None], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        # A row may see no key of this tile (an early query, a split of later keys only).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    out = acc / total[:, None]
    if DIRECT:  # one split: this is the final output, in the query's dtype
        o_ptrs = (
            out_ptr
            + token[:, None] * stride_o_seq
            + heads[:, None] * stride_o_head
            + offs_d[None, :]
        )
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        o_ptrs = (
            out_ptr
            + token[:, None] * stride_o_seq
            + heads[:, None] * stride_o_head
            + split * stride_o_split
            + offs_d[None, :]
        )
        tl.store(o_ptrs, out, mask=row_ok[:, None])
        lse = tl.where(total > 0, m + tl.log(total), float("-inf"))
        tl.store(lse_ptr + token * stride_l_seq + heads * stride_l_head + split, lse, mask=row_ok)


@triton.jit
def _write_new_kv(
    k_new_ptr, v_new_ptr, cos_ptr, sin_ptr, k_norm_ptr, eps, k_cache_ptr, v_cache_ptr, table,
    kv_head, query_start, num_queries, context_len, first_pos, end_pos, stride_new_seq,
    stride_cos, stride_k_block, stride_k_slot, stride_k_head, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HAS_NORM: tl.constexpr, QUERIES_P2: tl.constexpr,
):  # fmt: skip
    """The sequence's new tokens (its last num_queries positions) whose positions lie in
    [first_pos, end_pos): their key of this KV head normed and rotated, and their value, into
    the cache slots the block table gives."""
    j = tl.arange(0, QUERIES_P2)
    pos = context_len - num_queries + j
    mine = (j < num_queries) & (pos >= first_pos) & (pos < end_pos)
    token = query_start + j
    src = token[:, None] * stride_new_seq + kv_head * HEAD_DIM
    k = norm_rope_rows(
        k_new_ptr + src, cos_ptr + token[:, None] * stride_cos,
        sin_ptr + token[:, None] * stride_cos, k_norm_ptr, eps, mine[:, None], HEAD_DIM, HAS_NORM,
    )  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)[None, :]
    v = tl.load(v_new_ptr + src + offs_d, mask=mine[:, None], other=0.0)
    block = tl.load(table + pos // BLOCK_SIZE, mask=mine, other=0)
    slot = block.to(tl.int64) * stride_k_block + (pos % BLOCK_SIZE) * stride_k_slot
    at = slot[:, None] + kv_head * stride_k_head + offs_d
    tl.store(k_cache_ptr + at, k.to(k_cache_ptr.dtype.element_ty), mask=mine[:, None])
    tl.store(v_cache_ptr + at, v.to(v_cache_ptr.dtype.element_ty), mask=mine[:, None])


TILE_N = 64
# Warps a decode program runs with. As launched (Triton specializing the pointers and strides
# divisible by 16, which the engine's all are), a program at 4 takes 126 registers for sm_90,
# 38 KiB of shared memory and copies each key tile in with cp.async a tile ahead, no spills; at
# 8, 79 registers (tools/decode_attention_sass.py). The H100 measured 8 slower everywhere (timed
# in graphs: 93% of copy bandwidth against 94% at W1's large steps, 80% against 95% at the 8B's
# 64 sequences; docs/benchmarks.md, 2026-12-06 18:30), so 4 stays; device.decode_attention_warps
# sets it for a rank.
DECODE_WARPS = 4
# Query tokens per sequence the kernel takes at most (a verify step's drafts + 1).
MAX_QUERIES = 16


@dataclass(frozen=True)
class DecodeBuild:
    """How the decode programs are compiled and laid out: warps a program, Triton's pipelining
    depth (None: its default, which buffers one key tile; 5 buffers two), keys a tile, and the
    grid's order (`heads_first`: a sequence's KV heads in neighbouring programs, which read the
    same cache rows, instead of one KV head's sequences). device.decode_attention_warps and
    decode_attention_stages choose it for a rank; tools/bench_decode_kernel.py times the
    others (docs/benchmarks.md: none measured faster everywhere)."""

    warps: int = DECODE_WARPS
    stages: int | None = None
    tile: int = TILE_N
    heads_first: bool = False


DEFAULT_BUILD = DecodeBuild()


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """Enough programs to fill the GPU twice over, and no split shorter than two default tiles
    (128 keys), whatever tile a build takes: the splits device.decode_attention_tile=128 was
    timed with (tools/bench_decode_kernel.py)."""
    programs = num_seqs * num_kv_heads
    wanted = -(-2 * num_sms // programs)
    return max(1, min(wanted, max_context // (2 * TILE_N), 64))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    queries: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    rope_in: RopeIn | None = None,
    build: DecodeBuild = DEFAULT_BUILD,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks]
    int32; context_lens: [B] int32 (>= 1), each including the sequence's query tokens. One
    query per sequence (T = B) unless `queries` = (first query row of each sequence [B] int32,
    query count of each [B] int32, the largest count): a sequence's queries are its last
    positions, on consecutive rows of q. Returns [T, Hq, D]. Launches only: safe to capture in a
    CUDA graph when `out` and `workspace` are static. `rope_in`: q, k and v are raw (RopeIn);
    the kernel norms and rotates them and writes the new k and v to the cache itself.
    `build`: how the decode programs are compiled and laid out (DecodeBuild)."""
    num_rows, num_heads, head_dim = q.shape
    batch = block_tables.shape[0]
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    max_queries = 1 if queries is None else queries[2]
    if not 1 <= max_queries <= MAX_QUERIES:
        raise ValueError(
            f"{max_queries} query tokens per sequence; the kernel takes 1 to {MAX_QUERIES}"
        )
    query_starts, query_lens = (context_lens, context_lens) if queries is None else queries[:2]
    out = torch.empty_like(q) if out is None else out
    direct = num_splits == 1
    if direct:
        partial, lse = out, context_lens  # unused placeholders with the right device
        p_strides, l_strides = (out.stride(0), out.stride(1), 0), (0, 0)
    else:
        if workspace is None:
            partial = torch.empty(
                num_rows, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
            )
            lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=q.device)
        else:
            partial, lse = workspace[0][:num_rows], workspace[1][:num_rows]
        p_strides = (partial.stride(0), partial.stride(1), partial.stride(2))
        l_strides = (lse.stride(0), lse.stride(1))
    options = launch_options()
    new = _rope_in_arguments(rope_in, q)
    grid = (batch, num_kv_heads, num_splits)
    if build.heads_first:
        grid = (num_kv_heads, batch, num_splits)
    stages = {} if build.stages is None else {"num_stages": build.stages}
    _decode_partial[grid](
        q, k_cache, v_cache, block_tables, context_lens, query_starts, query_lens, partial, lse,
        scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        *p_strides, *l_strides,
        num_splits,
        *new,
        GROUP=group,
        GROUP_P2=triton.next_power_of_2(group),
        ROWS_PAD=max(16, triton.next_power_of_2(max_queries) * triton.next_power_of_2(group)),
        MULTI=queries is not None,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE_N=build.tile,
        DIRECT=direct,
        # float32 caches (tests, CPU-exact runs) keep full precision; tf32 would cost 1e-3.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PDL=bool(options),
        ROPE_IN=rope_in is not None,
        HAS_NORM=rope_in is not None and rope_in.q_weight is not None,
        QUERIES_P2=triton.next_power_of_2(max_queries),
        HEADS_FIRST=build.heads_first,
        num_warps=build.warps,
        **stages,
        **options,
    )  # fmt: skip
    if not direct:
        merge_splits[(num_rows, num_heads)](
            partial, lse, out,
            partial.stride(0), partial.stride(1), partial.stride(2),
            lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            num_splits,
            SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
            HEAD_DIM=head_dim,
            PDL=bool(options), **options,
        )  # fmt: skip
    return out


def _rope_in_arguments(rope_in: RopeIn | None, q: torch.Tensor) -> tuple:
    """The kernel's rope-in arguments: (k, v, cos, sin, q norm, k norm, token stride of k and v,
    of cos, eps); placeholders of the right kinds where there is none."""
    if rope_in is None:
        return (q, q, q, q, q, q, 0, 0, 0.0)
    k, v, cos = rope_in.k, rope_in.v, rope_in.cos
    if k.stride() != v.stride() or k.stride(2) != 1 or k.stride(1) != k.shape[2]:
        raise ValueError("rope_in's k and v must be laid out alike, each head's values contiguous")
    if rope_in.sin.stride() != cos.stride():
        raise ValueError("rope_in's cos and sin must be laid out alike")
    q_weight = rope_in.q_weight if rope_in.q_weight is not None else cos
    k_weight = rope_in.k_weight if rope_in.k_weight is not None else cos
    return (k, v, cos, rope_in.sin, q_weight, k_weight, k.stride(0), cos.stride(0), rope_in.eps)
