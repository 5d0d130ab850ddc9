"""Every architecture config.json may name has a model class, found without naming a module;
an unknown one is refused with the known ones listed."""

from __future__ import annotations

import pytest

from aioworker.checkpoint.model_config import SUPPORTED_ARCHITECTURES
from aioworker.compute.models.llama import LlamaForCausalLM
from aioworker.compute.models.registry import model_class


@pytest.mark.parametrize("architecture", list(SUPPORTED_ARCHITECTURES))
def test_every_supported_architecture_has_a_class(architecture: str) -> None:
    assert model_class(architecture) is LlamaForCausalLM


def test_an_unknown_architecture_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="'GPT2LMHeadModel'; known: LlamaForCausalLM"):
        model_class("GPT2LMHeadModel")
