"""Building a model: a quantized checkpoint, which no linear method loads yet, stops start-up
with a message naming its format instead of failing on its first unknown tensor."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model


def test_a_quantized_checkpoint_stops_start_up_naming_its_format(tmp_path) -> None:
    build_tiny_model("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method 'fp8'.*unquantized checkpoints only"):
        make_engine(tmp_path, **{"model.dtype": "float32", "cache.num_blocks": 64})
