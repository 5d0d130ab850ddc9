"""Self-speculation: the target model's first N decoder layers, then its own final norm and LM
head, as the draft model. It needs no other weights and no KV cache of its own: its layers are
the target's, so the KV it would write for a known token is exactly what the target wrote in
those layers, and the draft reads the target's cache. What it writes for its drafts lands in
slots the target's next step computes again. Weights updates, release and resume of the target
are therefore the draft's too, and it cannot drift from the target.

A shallow prefix of the target is a weak draft (its acceptance on real text is low without
training an exit head), but it is a real one: tests use it to drive the whole draft path on the
embedded model, and its step cost on the GPU bounds what a trained draft of that size buys."""

from __future__ import annotations

import torch

from aioworker.compute.layers.attention import AttentionContext


class SelfDraft:
    # Its KV is the target's: nothing of its own to allocate, release or catch up.
    owns_cache = False

    def __init__(self, target: torch.nn.Module, num_layers: int) -> None:
        total = len(target.model.layers)
        if not 1 <= num_layers < total:
            raise ValueError(
                f"a self-draft of {num_layers} layers from a model of {total}; give 1 to "
                f"{total - 1} (speculative.draft_layers)"
            )
        self.target = target
        self.num_layers = num_layers

    def __call__(
        self, token_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        return self.target(token_ids, positions, attn, num_layers=self.num_layers)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden)

    def attention_layers(self) -> list:
        return []
