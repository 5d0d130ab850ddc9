"""Weight loading: sharded checkpoints, and errors that name the offending tensor."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from aioworker.compute.loader import WeightsError
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model

SMALL = {"cache.num_blocks": 16, "model.max_model_len": 128}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_model("llama", path)
    return path


def rewrite(src, dst, edit) -> None:
    """Copy a single-file checkpoint with `edit` applied to its tensor dict."""
    for name in ("config.json", "generation_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))


def greedy(engine) -> list[int]:
    [c] = engine.generate(
        [[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )
    return c.token_ids


def test_sharded_checkpoint_loads_like_a_single_file(tiny_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tiny_dir).save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    single, sharded = make_engine(tiny_dir, **SMALL), make_engine(tmp_path, **SMALL)
    try:
        assert greedy(single) == greedy(sharded)
    finally:
        single.close()
        sharded.close()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"),
            "missing 1 tensor.*model.layers.1.self_attn.k_proj.weight",
        ),
        (lambda t: t.pop("model.norm.weight"), "missing 1 tensor.*model.norm.weight"),
        (
            lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}),
            "unexpected tensor 'model.layers.0.extra.weight'",
        ),
        (
            lambda t: t.update({"model.layers.0.mlp.down_proj.weight": torch.zeros(64, 95)}),
            r"model.layers.0.mlp.down_proj.weight: checkpoint tensor has shape \(64, 95\), expected \(64, 96\)",
        ),
        (
            lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.zeros(60, 64)}),
            r"q_proj.weight: checkpoint tensor has shape \(60, 64\)",
        ),
    ],
)
def test_bad_checkpoint_names_the_tensor(tiny_dir, tmp_path, edit, message) -> None:
    rewrite(tiny_dir, tmp_path, edit)
    with pytest.raises(WeightsError, match=message):
        make_engine(tmp_path, **SMALL)


def test_dummy_weights_need_no_checkpoint(tiny_dir, tmp_path) -> None:
    (tmp_path / "config.json").write_bytes((tiny_dir / "config.json").read_bytes())
    engine = make_engine(tmp_path, **SMALL, **{"model.load_format": "dummy"})
    try:
        assert len(greedy(engine)) == 8
    finally:
        engine.close()
