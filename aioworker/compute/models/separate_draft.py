"""A draft model of its own (speculative.model: a model directory or .gguf), with its own weights
and its own KV cache.

Its cache is indexed by the target's block ids: each of its attention layers holds as many
blocks as the target's, and a sequence's draft KV for position p lives in the same block and
slot as its target KV. So the scheduler's block tables, lookahead blocks and trims serve both,
and a rejected draft's slots are reused by both alike. What the draft must do itself is keep
its cache as full as the target's: every step it runs forward over the step's inputs
(the runner's `catch_up_draft`), prefill chunks, decodes and verified drafts alike, so that when it drafts, the
KV of every token the target has seen is in its cache.
"""

from __future__ import annotations

import torch

from aioworker.compute.layers.attention import AttentionContext


class SeparateDraft:
    # The runner catches it up every step (forward over the step's inputs) and allocates, releases and resumes this cache.
    owns_cache = True

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(
        self, token_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        return self.model(token_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def attention_layers(self) -> list:
        return self.model.attention_layers()
