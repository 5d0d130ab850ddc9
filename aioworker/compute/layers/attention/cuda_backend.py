"""The GPU attention backend: decodes through our Triton paged kernel, prefill chunks (ragged, with
or without cached context) through FlashAttention-2's varlen kernel as torch exposes it.

Metadata tensors live on the device and are built from the runner's persistent block-table
matrix, so a decode step needs no per-sequence host work; for pure decode batches the runner
fills static copies of them and replays a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import torch

from aioworker.compute.layers.attention.triton_decode import (
    DEFAULT_BUILD,
    DecodeBuild,
    RopeIn,
    paged_decode,
)
from aioworker.compute.layers.fused import qkv_rope_cache_

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # older torch: fall back to one SDPA call per chunk
    varlen_attn = None

_VARLEN_GQA = varlen_attn is not None and "enable_gqa" in inspect.signature(varlen_attn).parameters


@dataclass
class DecodePart:
    rows: torch.Tensor | None  # [Td] token rows attended this way; None when every row is
    block_tables: torch.Tensor  # [Bd, max_blocks] int32
    context_lens: torch.Tensor  # [Bd] int32, including the sequence's query tokens
    num_splits: int
    context_lens_host: list[int] | None = None  # for kernels that take host-side lengths
    # Where a sequence verifies drafts (several query tokens): each one's first query row among
    # the rows [Bd] int32, query counts [Bd] int32, and the largest; None: one query each.
    queries: tuple[torch.Tensor, torch.Tensor, int] | None = None


@dataclass
class PrefillPart:
    rows: torch.Tensor | None  # [Tp] batch rows of prefill tokens; None when every row is one
    cu_seqlens_q: torch.Tensor  # [P + 1] int32
    cu_seqlens_k: torch.Tensor  # [P + 1] int32
    max_q: int
    max_k: int
    # Cache slots of every prefill chunk's whole context, concatenated; None when no chunk has
    # cached context (then the chunk's own K/V are used directly).
    context_slots: torch.Tensor | None


@dataclass
class CudaAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    decode: DecodePart | None
    prefill: PrefillPart | None


class CudaAttentionBackend:
    name = "triton"
    supports_graphs = True
    # Its decode kernel takes several query tokens per sequence: verify steps read paged KV.
    verifies_paged = True

    def __init__(
        self,
        block_size: int,
        rope_in_decode: bool = False,
        decode_build: DecodeBuild = DEFAULT_BUILD,
        tile_128_from_programs: int = 0,
    ) -> None:
        """`tile_128_from_programs` (device.decode_attention_tile_128_from_programs): decode
        steps of at least that many (sequence, KV head) pairs take keys in tiles of 128 whatever
        `decode_build`'s tile; 0: none."""
        self.block_size = block_size
        self.rope_in_decode = rope_in_decode
        self.decode_build = decode_build  # device.decode_attention_*
        self.tile_128_from_programs = tile_128_from_programs
        self._large_build = dataclasses.replace(decode_build, tile=128)

    def decode_build_for(self, num_seqs: int, num_kv_heads: int) -> DecodeBuild:
        """The build a decode step of `num_seqs` sequences over `num_kv_heads` KV heads (the
        rank's) launches: tiles of 128 keys read faster from about 320 programs, except at 512
        (docs/benchmarks.md, 2026-12-07)."""
        programs = num_seqs * num_kv_heads
        if self.tile_128_from_programs and programs >= self.tile_128_from_programs:
            return self._large_build
        return self.decode_build

    def attend(self, q, k, v, rope, q_norm, k_norm, k_cache, v_cache, meta, scale):
        """A decode step's attention from raw q, k and v, the norms, rotary and cache write
        inside the decode kernel (device.fused_rope_attention): one launch fewer a layer. None
        where it does not apply (switched off, or the step prefills): the caller prepares q
        and k first, then calls forward."""
        if not self.rope_in_decode or meta.prefill is not None:
            return None
        cos, sin = rope
        q_weight = None if q_norm is None else q_norm.weight
        k_weight = None if k_norm is None else k_norm.weight
        eps = q_norm.eps if q_norm is not None else 0.0
        rope_in = RopeIn(k, v, cos, sin, q_weight, k_weight, eps)
        return self.decode(q, k_cache, v_cache, meta.decode, scale, rope_in)

    def prepare_qkv(self, q, k, v, rope, q_norm, k_norm, k_cache, v_cache, meta):
        """Norm, rotary and the cache write in one kernel launch; returns q, k (rotated in place)."""
        cos, sin = rope
        q_weight = None if q_norm is None else q_norm.weight
        k_weight = None if k_norm is None else k_norm.weight
        eps = q_norm.eps if q_norm is not None else 0.0
        qkv_rope_cache_(
            q, k, v, cos, sin, q_weight, k_weight, eps, k_cache, v_cache, meta.slot_mapping
        )
        return q, k

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: CudaAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D]
        decode, prefill = meta.decode, meta.prefill
        if prefill is None:
            return self.decode(q, k_cache, v_cache, decode, scale)
        if decode is None and prefill.rows is None:
            return _prefill(q, k, v, k_cache, v_cache, prefill, scale)
        out = torch.empty_like(q)
        if decode is not None:
            out[decode.rows] = self.decode(q[decode.rows], k_cache, v_cache, decode, scale)
        rows = prefill.rows
        out[rows] = _prefill(q[rows], k[rows], v[rows], k_cache, v_cache, prefill, scale)
        return out

    def decode(
        self, q, k_cache, v_cache, part: DecodePart, scale: float, rope_in: RopeIn | None = None
    ) -> torch.Tensor:
        return paged_decode(
            q,
            k_cache,
            v_cache,
            part.block_tables,
            part.context_lens,
            scale,
            part.num_splits,
            queries=part.queries,
            rope_in=rope_in,
            build=self.decode_build_for(part.block_tables.shape[0], k_cache.shape[2]),
        )


def _prefill(q, k, v, k_cache, v_cache, part: PrefillPart, scale: float) -> torch.Tensor:
    if part.context_slots is not None:
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k = k_cache.view(-1, num_kv_heads, head_dim)[part.context_slots]
        v = v_cache.view(-1, num_kv_heads, head_dim)[part.context_slots]
    if varlen_attn is None or q.dtype == torch.float32:  # FlashAttention: fp16 and bf16 only
        return _prefill_sdpa(q, k, v, part, scale)
    # K and V keep their fewer heads. A torch whose varlen_attn lacks `enable_gqa` (2.11) hands
    # them to FlashAttention-2 as they are, which shares each among its query heads: equal to
    # repeating them, and 1.49x faster in a 15,680-token prefill (H100, 2026-12-07).
    extra = {"enable_gqa": True} if _VARLEN_GQA else {}
    # window (-1, 0): causal, aligned to the end of each key range (chunks after cached context).
    return varlen_attn(
        q, k, v, part.cu_seqlens_q, part.cu_seqlens_k, part.max_q, part.max_k,
        scale=scale, window_size=(-1, 0), **extra,
    )  # fmt: skip


def _prefill_sdpa(q, k, v, part: PrefillPart, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    cu_q, cu_k = part.cu_seqlens_q.tolist(), part.cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        n_q, n_k = qs.stop - qs.start, ks.stop - ks.start
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        out[qs] = torch.nn.functional.scaled_dot_product_attention(
            q[qs].transpose(0, 1), k[ks].transpose(0, 1), v[ks].transpose(0, 1),
            attn_mask=visible, scale=scale, enable_gqa=True,
        ).transpose(0, 1)  # fmt: skip
    return out
