"""Paged attention with torch's scaled_dot_product_attention: one batched call for all decodes,
one call per prefill chunk. Runs anywhere; used on the CPU and as the GPU reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aioworker.layers.attention.slots import SeqSlots, slot_mapping


@dataclass
class PrefillChunk:
    token_start: int
    num_tokens: int
    # Slots of the whole visible context when part of it is already cached; None = no context.
    context_slots: torch.Tensor | None
    # Boolean "may attend" mask [n, context]; None = plain causal over the chunk itself.
    mask: torch.Tensor | None


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot of each input token
    decode_token_idx: torch.Tensor | None  # [B] rows of the batch that decode one token
    decode_is_whole_batch: bool
    decode_slots: torch.Tensor | None  # [B, L] slots of each decode's context, padded
    decode_mask: torch.Tensor | None  # [B, 1, 1, L]
    prefills: list[PrefillChunk]


class TorchAttentionBackend:
    name = "torch"

    def __init__(self, block_size: int, sliding_window: int | None) -> None:
        self.block_size = block_size
        self.sliding_window = sliding_window

    def build_metadata(self, seqs: list[SeqSlots], device: torch.device) -> TorchAttentionMetadata:
        decode_rows = [i for i, s in enumerate(seqs) if s.num_tokens == 1]
        token_starts = _token_starts(seqs)
        prefills = [
            self._prefill_chunk(seqs[i], token_starts[i], device)
            for i in range(len(seqs))
            if seqs[i].num_tokens > 1
        ]
        decode_slots = decode_mask = decode_idx = None
        if decode_rows:
            decode_slots, decode_mask = self._decode_context([seqs[i] for i in decode_rows], device)
            decode_idx = torch.tensor([token_starts[i] for i in decode_rows], device=device)
        return TorchAttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping(seqs, self.block_size), device=device),
            decode_token_idx=decode_idx,
            decode_is_whole_batch=len(decode_rows) == len(seqs),
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=prefills,
        )

    def _decode_context(
        self, seqs: list[SeqSlots], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        max_len = max(s.start_pos + 1 for s in seqs)
        slots = torch.zeros(len(seqs), max_len, dtype=torch.long)
        for row, seq in enumerate(seqs):
            slots[row, : seq.start_pos + 1] = torch.tensor(seq.context_slots(self.block_size))
        key_pos = torch.arange(max_len)[None, :]
        query_pos = torch.tensor([s.start_pos for s in seqs])[:, None]
        mask = self._visible(query_pos, key_pos)
        return slots.to(device), mask[:, None, None, :].to(device)

    def _prefill_chunk(self, seq: SeqSlots, token_start: int, device: torch.device) -> PrefillChunk:
        if seq.start_pos == 0 and self.sliding_window is None:
            return PrefillChunk(token_start, seq.num_tokens, None, None)
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
        # q: [T, Hq, D]; k, v: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D]
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k_flat = k_cache.view(-1, num_kv_heads, head_dim)
        v_flat = v_cache.view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, k)
        v_flat.index_copy_(0, meta.slot_mapping, v)
        if meta.decode_is_whole_batch:
            return self._decode(q, k_flat, v_flat, meta, scale)
        out = torch.empty_like(q)
        if meta.decode_token_idx is not None:
            out[meta.decode_token_idx] = self._decode(
                q[meta.decode_token_idx], k_flat, v_flat, meta, scale
            )
        for chunk in meta.prefills:
            rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
            out[rows] = self._prefill(q[rows], k[rows], v[rows], k_flat, v_flat, chunk, scale)
        return out

    @staticmethod
    def _decode(q, k_flat, v_flat, meta: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        # q: [B, Hq, D] -> keys [B, Hkv, L, D] gathered from the cache
        keys = k_flat[meta.decode_slots].transpose(1, 2)
        values = v_flat[meta.decode_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        return out.squeeze(2)

    @staticmethod
    def _prefill(q, k, v, k_flat, v_flat, chunk: PrefillChunk, scale: float) -> torch.Tensor:
        # q: [n, Hq, D]; attention runs over heads as the batch: [H, n, D]
        if chunk.context_slots is not None:
            k, v = k_flat[chunk.context_slots], v_flat[chunk.context_slots]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(0, 1)


def _token_starts(seqs: list[SeqSlots]) -> list[int]:
    starts, total = [], 0
    for seq in seqs:
        starts.append(total)
        total += seq.num_tokens
    return starts
