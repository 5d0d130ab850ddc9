"""Staging a checkpoint directory: with a checksums.json, every tensor must be listed and match."""

from __future__ import annotations

import json

import pytest

from aioworker.compute.loader import WeightsError
from aioworker.compute.weights.staging import CHECKSUM_FILE, stage_from_directory, write_checksums
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("staging") / "model"
    build_tiny_model("qwen3", path, seed=0)
    return path


@pytest.fixture(scope="module")
def model(checkpoint):
    engine = make_engine(checkpoint, **{"cache.num_blocks": 16, "model.max_model_len": 128})
    yield engine.executor.weights.model
    engine.close()


def test_a_checkpoint_with_every_tensor_listed_stages(model, checkpoint, tmp_path) -> None:
    checked = _copy(checkpoint, tmp_path / "checked")
    write_checksums(checked)
    staged = stage_from_directory(model, checked)
    assert set(staged) == set(dict(model.named_parameters()))


def test_a_tensor_missing_from_the_checksums_is_refused(model, checkpoint, tmp_path) -> None:
    checked = _copy(checkpoint, tmp_path / "partial")
    checksum_file = write_checksums(checked)
    checksums = json.loads(checksum_file.read_text())
    del checksums["model.norm.weight"]
    checksum_file.write_text(json.dumps(checksums))
    with pytest.raises(WeightsError) as failure:
        stage_from_directory(model, checked)
    message = str(failure.value)
    assert "model.norm.weight" in message and str(checked / CHECKSUM_FILE) in message


def _copy(source, target):
    target.mkdir()
    for name in ("config.json", "model.safetensors"):
        (target / name).write_bytes((source / name).read_bytes())
    return target
