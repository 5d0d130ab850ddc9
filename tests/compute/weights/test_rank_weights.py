"""A rank's weights owner, through the executor thread: stage then commit serves the new weights,
stage then rollback keeps the old ones, a commit while the weights are released is applied
on resume; a separate draft's weights are updated where the update names them ("draft.") and
kept where it does not, and released and resumed with the target's."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import WeightsPhase
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model

# The CPU path, wherever the tests run (on a GPU machine "auto" would pick CUDA and bf16).
SMALL = {"cache.num_blocks": 64, "model.max_model_len": 256, "device.kind": "cpu"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROBES = [[3, 4, 5], [10, 11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two checkpoints of the same shapes, the old weights and the new, and the new embedding."""
    root = tmp_path_factory.mktemp("weights")
    build_tiny_model("qwen3", root / "old", seed=0)
    new = build_tiny_model("qwen3", root / "new", seed=1)
    return root / "old", root / "new", new.model.embed_tokens.weight.detach().clone()


def greedy(engine) -> list[list[int]]:
    return [c.token_ids for c in engine.generate(PROBES, GREEDY)]


@pytest.fixture(scope="module")
def expected(checkpoints):
    """Greedy tokens of fresh engines on the old and on the new weights."""
    tokens = []
    for path in checkpoints[:2]:
        engine = make_engine(path, **SMALL)
        tokens.append(greedy(engine))
        engine.close()
    assert tokens[0] != tokens[1]
    return tokens


@pytest.fixture
def engine(checkpoints):
    engine = make_engine(checkpoints[0], **SMALL)
    yield engine
    engine.close()


def run(engine, op: str, **fields) -> int:
    return engine.executor.run_weights_phase(WeightsPhase(op=op, **fields)).result()


def embedding(engine) -> torch.Tensor:
    return engine.executor.weights.model.model.embed_tokens.weight


def test_stage_then_commit_serves_the_new_weights(engine, checkpoints, expected) -> None:
    assert run(engine, "stage", path=str(checkpoints[1])) == 0
    assert greedy(engine) == expected[0]  # staged, not yet live
    assert run(engine, "commit") == 0
    assert engine.executor.weights.staged is None
    assert torch.equal(embedding(engine), checkpoints[2])
    assert greedy(engine) == expected[1]


def test_stage_then_rollback_keeps_the_old_weights(engine, checkpoints, expected) -> None:
    old = embedding(engine).clone()
    run(engine, "stage", path=str(checkpoints[1]))
    run(engine, "rollback")
    assert engine.executor.weights.staged is None
    assert torch.equal(embedding(engine), old)
    assert greedy(engine) == expected[0]
    with pytest.raises(RuntimeError, match="commit without staged weights"):
        run(engine, "commit")


def test_a_commit_while_released_is_applied_on_resume(engine, checkpoints, expected) -> None:
    run(engine, "stage", path=str(checkpoints[1]))
    assert isinstance(run(engine, "release"), int)
    assert engine.executor.weights.memory.weights_released
    run(engine, "commit")
    assert engine.executor.weights.staged is None
    run(engine, "resume")
    assert not engine.executor.weights.memory.weights_released
    assert torch.equal(embedding(engine), checkpoints[2])
    assert greedy(engine) == expected[1]


# -- a separate draft model ---------------------------------------------------------------------


@pytest.fixture
def drafting(checkpoints):
    """The old weights, drafting with a separate copy of the old weights."""
    settings = {"speculative.method": "draft", "speculative.model": str(checkpoints[0])}
    engine = make_engine(checkpoints[0], **SMALL, **settings)
    yield engine
    engine.close()


def draft_embedding(engine) -> torch.Tensor:
    return engine.executor.runner.draft.model.model.embed_tokens.weight


def test_an_update_naming_the_draft_updates_it_too(drafting, checkpoints, tmp_path) -> None:
    new = load_file(str(checkpoints[1] / "model.safetensors"))
    both = {**new, **{"draft." + name: tensor.clone() for name, tensor in new.items()}}
    save_file(both, str(tmp_path / "model.safetensors"))
    run(drafting, "stage", path=str(tmp_path))
    run(drafting, "commit")
    assert torch.equal(embedding(drafting), checkpoints[2])
    assert torch.equal(draft_embedding(drafting), checkpoints[2])


def test_an_update_naming_only_the_target_keeps_the_draft_through_release(
    drafting, checkpoints, expected
) -> None:
    old_draft = draft_embedding(drafting).clone()
    run(drafting, "stage", path=str(checkpoints[1]))
    run(drafting, "release", weights=True, kv_cache=True)
    assert draft_embedding(drafting).numel() == 0
    assert all(layer.k_cache.numel() == 0 for layer in drafting.executor.runner.kv_layers())
    run(drafting, "commit")
    run(drafting, "resume")
    assert torch.equal(embedding(drafting), checkpoints[2])
    assert torch.equal(draft_embedding(drafting), old_draft)
    assert all(layer.k_cache.numel() > 0 for layer in drafting.executor.runner.kv_layers())
    assert greedy(drafting) == expected[1]  # the old draft's tokens verified by the new target
