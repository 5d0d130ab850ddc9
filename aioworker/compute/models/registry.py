"""Architecture name (config.json's `architectures`) -> the class that builds it, imported only
when a model of that architecture is built: a new architecture is one module and one line here."""

from __future__ import annotations

import importlib

_LLAMA = ("aioworker.compute.models.llama", "LlamaForCausalLM")

MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _LLAMA,
    "Qwen3ForCausalLM": _LLAMA,
    "Qwen2MoeForCausalLM": _LLAMA,
    "Qwen3MoeForCausalLM": _LLAMA,
    "MixtralForCausalLM": _LLAMA,
    "Ernie4_5ForCausalLM": _LLAMA,
    "Ernie4_5_MoeForCausalLM": _LLAMA,
}


def model_class(architecture: str) -> type:
    """The class for an architecture; ValueError naming the known ones where there is none."""
    entry = MODELS.get(architecture)
    if entry is None:
        raise ValueError(
            f"no model class for architecture {architecture!r}; known: {', '.join(MODELS)}"
        )
    module, name = entry
    return getattr(importlib.import_module(module), name)
