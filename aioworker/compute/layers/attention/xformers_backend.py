"""The same GPU backend with xformers' paged decode kernel (triton_splitk) in place of ours.

xformers builds its paged mask from host-side lengths, so this backend runs eagerly (no CUDA
graphs), and its kernel needs pages of a multiple of 64 tokens.
"""

from __future__ import annotations

import torch

from aioworker.compute.layers.attention.cuda_backend import CudaAttentionBackend, DecodePart


class XformersAttentionBackend(CudaAttentionBackend):
    name = "xformers"
    supports_graphs = False
    verifies_paged = False  # verify steps' rows go through the prefill kernel

    def __init__(self, block_size: int) -> None:
        if block_size % 64:
            raise ValueError(
                f"xformers' paged attention needs cache.block_size to be a multiple of 64, not {block_size}"
            )
        super().__init__(block_size)
        from xformers.ops import fmha  # imported here: only this backend needs xformers

        self.fmha = fmha

    def decode(self, q, k_cache, v_cache, part: DecodePart, scale: float) -> torch.Tensor:
        # q: [B, Hq, D] -> [1, B, Hkv, G, D]; the cache as [1, slots, Hkv, G, D] (G: a broadcast view)
        batch, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        mask = self.fmha.attn_bias.PagedBlockDiagonalPaddedKeysMask.from_seqlens(
            q_seqlen=[1] * batch,
            kv_seqlen=part.context_lens_host,
            block_tables=part.block_tables,
            page_size=self.block_size,
        )
        shape = (1, -1, num_kv_heads, group, head_dim)
        keys = k_cache.view(1, -1, num_kv_heads, 1, head_dim).expand(shape)
        values = v_cache.view(1, -1, num_kv_heads, 1, head_dim).expand(shape)
        out = self.fmha.memory_efficient_attention_forward(
            q.view(1, batch, num_kv_heads, group, head_dim),
            keys,
            values,
            attn_bias=mask,
            op=self.fmha.triton_splitk.FwOp,
            scale=scale,
        )
        return out.view(batch, num_heads, head_dim)
