"""A draft that cannot work with its target stops start-up naming the key to change; a separate
draft gets a KV cache of its own, as many blocks as the target's."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioworker.compute.models.separate_draft import SeparateDraft
from aioworker.config import ConfigError
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model

DRAFTING = {
    "speculative.method": "draft",
    "model.dtype": "float32",
    "cache.num_blocks": 64,
    "model.max_model_len": 256,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-target")
    build_tiny_model("llama", path)
    return path


def test_a_draft_with_another_vocabulary_is_refused(tiny, tmp_path) -> None:
    build_tiny_model("llama", tmp_path, vocab_size=12)
    with pytest.raises(ConfigError, match="speculative.model .* vocabulary of 12 tokens"):
        make_engine(tiny, **DRAFTING, **{"speculative.model": str(tmp_path)})


def test_a_missing_draft_model_is_refused(tiny, tmp_path) -> None:
    with pytest.raises(ConfigError, match="speculative.model"):
        make_engine(tiny, **DRAFTING, **{"speculative.model": str(tmp_path / "nowhere")})


def test_a_self_draft_as_deep_as_the_target_is_refused(tiny) -> None:
    with pytest.raises(ConfigError, match="speculative.draft_layers"):
        make_engine(tiny, **DRAFTING, **{"speculative.draft_layers": 2})


def test_a_draft_split_over_other_ranks_than_the_targets_is_refused(tiny, tmp_path) -> None:
    settings = {"speculative.model": str(tiny), "speculative.draft_tensor_parallel_size": 3}
    with pytest.raises(ConfigError, match="speculative.draft_tensor_parallel_size is 3"):
        make_engine(tiny, **DRAFTING, **settings)


def test_a_separate_draft_has_a_cache_of_its_own(tiny, tmp_path) -> None:
    build_tiny_model("llama", tmp_path, seed=3)
    engine = make_engine(tiny, **DRAFTING, **{"speculative.model": str(tmp_path)})
    try:
        runner = engine.executor.runner
        assert isinstance(runner.draft, SeparateDraft)
        target_cache = runner.model.attention_layers()[0].k_cache
        draft_cache = runner.draft.attention_layers()[0].k_cache
        assert draft_cache.shape == target_cache.shape
        assert draft_cache.data_ptr() != target_cache.data_ptr()
        assert len(runner.kv_layers()) == 4  # two layers each
    finally:
        engine.close()
