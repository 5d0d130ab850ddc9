"""One Llama-family decoder: Llama (incl. Llama-3 rope scaling), Mistral, Qwen2 (q/k/v bias),
Qwen3 (per-head q/k RMSNorm) and ERNIE 4.5 (interleaved rotary pairs) are variants of the same
blocks, chosen by ModelConfig flags; their MoE kin (Qwen2-MoE, Qwen3-MoE, Mixtral, ERNIE 4.5 MoE)
differ only in their feed-forward blocks (feed_forward.py).

Tokens of all scheduled sequences are flattened into one batch: activations are [T, D].
"""

from __future__ import annotations

import torch
from torch import nn

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers.attention import AttentionContext
from aioworker.compute.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from aioworker.compute.layers.linear import QKVParallelLinear, RowParallelLinear
from aioworker.compute.layers.linear_method import DENSE, LinearMethods, normed_product
from aioworker.compute.layers.norm import RMSNorm
from aioworker.compute.layers.ops import add_rms_norm
from aioworker.compute.layers.rotary import RotaryEmbedding, deinterleave_heads
from aioworker.compute.models.feed_forward import feed_forward, normed_feed_forward
from aioworker.compute.parallel import TensorParallel


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel, methods: LinearMethods) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.qkv_bias, tp, methods.projections,
        )  # fmt: skip
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * cfg.head_dim,
            cfg.hidden_size,
            False,
            tp,
            in_shard=self.qkv_proj.q_shard,
            linear_method=methods.projections,
        )
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim**-0.5
        # Bound by the model runner once the KV cache is allocated.
        self.k_cache = self.v_cache = torch.empty(0)

    def attend(
        self, rope: tuple[torch.Tensor, torch.Tensor], qkv: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        """qkv: this layer's qkv_proj product [T, (Hq + 2 Hkv) D] (the decoder layer takes it
        with its norm) -> the attention's output before o_proj, [T, Hq D]; the decoder layer
        multiplies it by o_proj with the norm after it (forward_then_norm)."""
        num_tokens = qkv.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        caches = (self.k_cache, self.v_cache)
        attend = getattr(attn.backend, "attend", None)  # backend.py: optional, in one go
        out = None
        if attend is not None:
            out = attend(
                q, k, v, rope, self.q_norm, self.k_norm, *caches, attn.metadata, self.scale
            )
        if out is None:
            q, k = attn.backend.prepare_qkv(
                q, k, v, rope, self.q_norm, self.k_norm, *caches, attn.metadata
            )
            out = attn.backend.forward(q, k, v, *caches, attn.metadata, self.scale)
        return out.reshape(num_tokens, q_size)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_index: int, tp: TensorParallel, methods: LinearMethods
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, tp, methods)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = feed_forward(cfg, layer_index, tp, methods)

    def forward(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        x: torch.Tensor,
        residual,
        attn: AttentionContext,
        next_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns this layer's MLP output and the residual stream before it is added: the next
        layer (or the final norm) adds them, fused with its norm. Each add and norm runs inside
        the product that reads it (qkv, gate/up) where that product's method can, or is split
        between the products around it (the o and down products' finish starts it: PreNormed).
        next_norm: the next layer's input norm."""
        qkv, residual = normed_product(self.self_attn.qkv_proj, self.input_layernorm, x, residual)
        out = self.self_attn.attend(rope, qkv, attn)
        x = self.self_attn.o_proj.forward_then_norm(out, residual, self.post_attention_layernorm)
        return normed_feed_forward(self.mlp, self.post_attention_layernorm, x, residual, next_norm)


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ModelConfig, max_model_len: int, tp: TensorParallel, methods: LinearMethods
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_model_len, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, i, tp, methods) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionContext,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """`num_layers`: run only the first this many layers, then the final norm (a
        self-draft); None: all."""
        x = self.embed_tokens(token_ids)
        rope = self.rotary.cos_sin(positions)
        residual = None
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        for index, layer in enumerate(layers):
            # The last layer's output goes into the final norm, which stays a kernel of its own.
            last = index == len(layers) - 1
            next_norm = None if last else layers[index + 1].input_layernorm
            x, residual = layer(rope, x, residual, attn, next_norm)
        return add_rms_norm(self.norm, x, residual)[0]


class LlamaForCausalLM(nn.Module):
    # Checkpoint tensor name part -> (our merged parameter's name part, shard id).
    packed_modules = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self,
        cfg: ModelConfig,
        max_model_len: int,
        tp: TensorParallel,
        methods: LinearMethods = DENSE,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, max_model_len, tp, methods)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp, methods.lm_head)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionContext,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """token_ids, positions: [T] -> final hidden states [T, D] (after the first
        `num_layers` layers only, where given)."""
        return self.model(token_ids, positions, attn, num_layers)

    def adapt_checkpoint_tensor(
        self, param_name: str, shard_id: object, tensor: torch.Tensor
    ) -> torch.Tensor:
        """ERNIE's q and k rows (and their per-row scales) in the rotate-half layout."""
        cfg = self.config
        if not cfg.rope_interleaved or ".qkv_proj." not in param_name or shard_id not in (0, 1):
            return tensor
        heads = cfg.num_attention_heads if shard_id == 0 else cfg.num_key_value_heads
        if tensor.shape[0] != heads * cfg.head_dim:
            return tensor  # a scale per block of rows: the block spans the head's dimensions
        return deinterleave_heads(tensor, cfg.head_dim)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def attention_layers(self) -> list[LlamaAttention]:
        return [layer.self_attn for layer in self.model.layers]
