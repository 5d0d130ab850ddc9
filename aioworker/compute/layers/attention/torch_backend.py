"""Paged attention in plain torch: one batched computation for all decodes, one
scaled_dot_product_attention call for all fresh prefills of one length, and one per prefill chunk
that reads cached context. Runs anywhere; used on the CPU and as the GPU reference.

Its cache is head-outer, [num_kv_heads, num_blocks, block_size, head_dim] per layer: the blocks
gathered for a decode batch are then already [kv head, sequence, position, dim], the batched
matrices of the two products, so no copy reorders them (on the CPU the reordering copies took
more time than the products themselves: docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aioworker.compute.layers.attention.cpu_decode import PagedDecode
from aioworker.compute.layers.attention.slots import SeqSlots, slot_mapping
from aioworker.compute.layers.ops import norm_rope


@dataclass
class PrefillChunk:
    """A prefill chunk that attends to context already cached (or through a sliding window)."""

    token_start: int
    num_tokens: int
    context_slots: torch.Tensor  # slots of the whole visible context, its own keys last
    mask: torch.Tensor  # boolean "may attend" [n, context]


@dataclass
class FreshPrefills:
    """Prefills of the same length with nothing cached before them: one batched causal call.
    (A step of many short prompts took one call per prompt per layer, which on the CPU cost more
    than the model's products.)"""

    num_tokens: int
    rows: torch.Tensor  # [prompts, num_tokens] int64: their rows in the step's batch


@dataclass
class DecodeContext:
    """Where the keys of the decoding sequences lie: their block tables, padded to the longest."""

    block_table: torch.Tensor  # [B, max_blocks] int64
    context_lens: torch.Tensor  # [B] int64: positions 0 .. len - 1 are attended
    max_context: int
    # 0 where visible, -inf where not: [1, B, 1, max_blocks * block_size], float32; only for the
    # torch path (the CPU kernel reads the lengths)
    bias: torch.Tensor | None


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot of each input token
    decode_token_idx: torch.Tensor | None  # [B] rows of the batch that decode one token
    decode_is_whole_batch: bool
    decode: DecodeContext | None
    prefills: list[PrefillChunk]
    fresh: list[FreshPrefills]


class TorchAttentionBackend:
    name = "torch"
    supports_graphs = False

    def __init__(
        self, block_size: int, sliding_window: int | None, decode_kernel: PagedDecode | None = None
    ) -> None:
        """`decode_kernel`: the CPU's paged decode kernel, where it was built and serves the
        model (cpu_decode.py); None computes decodes in torch."""
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.decode_kernel = decode_kernel

    @staticmethod
    def cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        return (num_kv_heads, num_blocks, block_size, head_dim)

    def build_metadata(self, seqs: list[SeqSlots], device: torch.device) -> TorchAttentionMetadata:
        decode_rows = [i for i, s in enumerate(seqs) if s.num_tokens == 1]
        token_starts = _token_starts(seqs)
        prefill_rows = [i for i, s in enumerate(seqs) if s.num_tokens > 1]
        fresh_rows = [i for i in prefill_rows if self._is_fresh(seqs[i])]
        prefills = [
            self._prefill_chunk(seqs[i], token_starts[i], device)
            for i in prefill_rows
            if not self._is_fresh(seqs[i])
        ]
        decode = decode_idx = None
        if decode_rows:
            decode = self._decode_context([seqs[i] for i in decode_rows], device)
            decode_idx = torch.tensor([token_starts[i] for i in decode_rows], device=device)
        return TorchAttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping(seqs, self.block_size), device=device),
            decode_token_idx=decode_idx,
            decode_is_whole_batch=len(decode_rows) == len(seqs),
            decode=decode,
            prefills=prefills,
            fresh=_fresh_groups(
                [seqs[i] for i in fresh_rows], [token_starts[i] for i in fresh_rows], device
            ),
        )

    def _is_fresh(self, seq: SeqSlots) -> bool:
        return seq.start_pos == 0 and self.sliding_window is None

    def _decode_context(self, seqs: list[SeqSlots], device: torch.device) -> DecodeContext:
        lengths = [s.start_pos + 1 for s in seqs]
        max_blocks = -(-max(lengths) // self.block_size)
        block_table = torch.zeros(len(seqs), max_blocks, dtype=torch.long)
        for row, seq in enumerate(seqs):
            used = seq.block_table[:max_blocks]
            block_table[row, : len(used)] = torch.tensor(used, dtype=torch.long)
        bias = None
        if self.decode_kernel is None:
            # Whole blocks are gathered (one index_select) and positions past the end masked out.
            key_pos = torch.arange(max_blocks * self.block_size)[None, :]
            query_pos = torch.tensor(lengths)[:, None] - 1
            bias = torch.zeros(len(seqs), key_pos.shape[1])
            bias.masked_fill_(~self._visible(query_pos, key_pos), float("-inf"))
            bias = bias[None, :, None, :].to(device)
        return DecodeContext(
            block_table.to(device), torch.tensor(lengths, device=device), max(lengths), bias
        )

    def _prefill_chunk(self, seq: SeqSlots, token_start: int, device: torch.device) -> PrefillChunk:
        context_len = seq.start_pos + seq.num_tokens
        query_pos = torch.arange(seq.start_pos, context_len)[:, None]
        mask = self._visible(query_pos, torch.arange(context_len)[None, :])
        slots = torch.tensor(seq.context_slots(self.block_size), device=device)
        return PrefillChunk(token_start, seq.num_tokens, slots, mask.to(device))

    def _visible(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        visible = key_pos <= query_pos
        if self.sliding_window is not None:
            visible &= key_pos > query_pos - self.sliding_window
        return visible

    def prepare_qkv(self, q, k, v, rope, q_norm, k_norm, k_cache, v_cache, meta):
        """Per-head norm and rotary on q and k, and k, v into the cache; returns q, k."""
        q, k = norm_rope(q, k, rope, q_norm, k_norm)
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        # [T, Hkv, D] -> the slots of [Hkv, num_blocks * block_size, D]
        k_cache.view(num_kv_heads, -1, head_dim).index_copy_(
            1, meta.slot_mapping, k.transpose(0, 1)
        )
        v_cache.view(num_kv_heads, -1, head_dim).index_copy_(
            1, meta.slot_mapping, v.transpose(0, 1)
        )
        return q, k

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: TorchAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]; caches: [Hkv, num_blocks, block_size, D]
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k_flat = k_cache.view(num_kv_heads, -1, head_dim)
        v_flat = v_cache.view(num_kv_heads, -1, head_dim)
        if meta.decode_is_whole_batch:
            return self._decode(q, k_cache, v_cache, meta, scale)
        out = torch.empty_like(q)
        if meta.decode_token_idx is not None:
            out[meta.decode_token_idx] = self._decode(
                q[meta.decode_token_idx], k_cache, v_cache, meta, scale
            )
        for chunk in meta.prefills:
            rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
            out[rows] = self._prefill(k_flat, v_flat, q[rows], chunk, scale)
        for group in meta.fresh:
            out[group.rows] = _fresh_prefill(q, k, v, group.rows, scale)
        return out

    def _decode(self, q, k_cache, v_cache, meta: TorchAttentionMetadata, scale: float):
        """Single-token queries: the CPU kernel where there is one, else in torch."""
        decode = meta.decode
        if self.decode_kernel is not None:
            return self.decode_kernel(
                q, k_cache, v_cache, decode.block_table, decode.context_lens,
                decode.max_context, scale, self.sliding_window or 0,
            )  # fmt: skip
        return _gathered_decode(q, k_cache, v_cache, decode, scale)

    @staticmethod
    def _prefill(k_flat, v_flat, q, chunk: PrefillChunk, scale: float) -> torch.Tensor:
        # q: [n, Hq, D]; attention runs over heads: [1, H, n, D]. Four dimensions, not three:
        # torch's CPU flash kernel takes only 4-D inputs and leaves 3-D ones to the unfused
        # math path, which took a bf16 128-token chunk's attention 1.09 ms a layer, against 0.49.
        # The cache is head-outer: [Hkv, context, D].
        keys, values = k_flat[:, chunk.context_slots], v_flat[:, chunk.context_slots]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys[None],
            values[None],
            attn_mask=chunk.mask,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)


def _fresh_prefill(q, k, v, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of same-length prompts over themselves: [P, n] rows -> [P, n, Hq, D]."""
    # [P, n, H, D] -> [P, H, n, D]: four dimensions, as the CPU flash kernel takes (_prefill)
    out = F.scaled_dot_product_attention(
        q[rows].transpose(1, 2),
        k[rows].transpose(1, 2),
        v[rows].transpose(1, 2),
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)


def _fresh_groups(seqs: list[SeqSlots], starts: list[int], device) -> list[FreshPrefills]:
    by_length: dict[int, list[int]] = {}
    for seq, start in zip(seqs, starts, strict=True):
        by_length.setdefault(seq.num_tokens, []).append(start)
    return [
        FreshPrefills(n, (torch.tensor(firsts)[:, None] + torch.arange(n)[None, :]).to(device))
        for n, firsts in by_length.items()
    ]


def _gathered_decode(q, k_cache, v_cache, decode: DecodeContext, scale: float) -> torch.Tensor:
    """Two batched products over [kv head x sequence] matrices, softmax in float32. On the CPU
    this beats scaled_dot_product_attention's kernel for single-token queries in bf16 several
    times over, and matches it in float32."""
    # q: [B, Hq, D] -> context [Hkv * B, L, D] gathered block by block from the cache
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    block_ids = decode.block_table.flatten()
    keys = k_cache.index_select(1, block_ids).view(num_kv_heads * batch, -1, head_dim)
    values = v_cache.index_select(1, block_ids).view(num_kv_heads * batch, -1, head_dim)
    grouped = (q.view(batch, num_kv_heads, group, head_dim).transpose(0, 1) * scale).reshape(
        num_kv_heads * batch, group, head_dim
    )
    scores = torch.bmm(grouped, keys.transpose(1, 2)).view(num_kv_heads, batch, group, -1)
    probs = (scores.float() + decode.bias).softmax(dim=-1).to(q.dtype)
    out = torch.bmm(probs.view(num_kv_heads * batch, group, -1), values)
    # [Hkv, B, G, D] -> [B, Hq, D]
    return (
        out.view(num_kv_heads, batch, group, head_dim)
        .transpose(0, 1)
        .reshape(batch, num_heads, head_dim)
    )


def _token_starts(seqs: list[SeqSlots]) -> list[int]:
    starts, total = [], 0
    for seq in seqs:
        starts.append(total)
        total += seq.num_tokens
    return starts
