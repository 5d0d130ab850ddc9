"""Guided decoding on the GPU (`pytest -m gpu`): masks applied on the device equal the CPU's, and
a model at the Qwen3-0.6B shape with random weights, whose tokens only the grammar decides,
writes valid JSON through CUDA graphs, with n-gram speculation's verify graphs, and in batches
where guided and unguided rows mix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from aioworker.compute.step.logits import apply_grammar_masks, refused_tokens
from aioworker.config import load_config
from aioworker.core.grammar import StepMasks
from aioworker.core.guided import GuidedParams
from aioworker.core.outputs import FinishReason
from aioworker.core.sampling_params import SamplingParams
from tests.guided_schemas import PERSON, PRODUCT

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
QWEN3_06B = ROOT / "configs" / "models" / "qwen3-0.6b"
# The GPU machine has no embedded model: its tokenizer travels with the run (.gpu/, staged by
# tools/gpu_prepare_extra.sh).
TOKENIZERS = (ROOT / ".gpu" / "tokenizer.json",)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    found = [path for path in TOKENIZERS if path.is_file()]
    if not found:
        pytest.skip("no tokenizer.json to guide with (.gpu/tokenizer.json)")
    directory = tmp_path_factory.mktemp("qwen3-shape")
    shutil.copy(QWEN3_06B / "config.json", directory)
    shutil.copy(found[0], directory / "tokenizer.json")
    return directory


def make_engine(model_dir: Path, **overrides):
    from aioworker.engine import LLMEngine

    settings = {
        "model.path": str(model_dir),
        "model.load_format": "dummy",
        "device.kind": "cuda",
        "model.max_model_len": 2048,
        "cache.num_blocks": 2048,
        **overrides,
    }
    return LLMEngine.from_config(load_config(overrides=settings), progress=False)


def test_device_masks_equal_the_cpu_masks() -> None:
    rng = np.random.default_rng(0)
    vocab = 151936
    logits = torch.randn(8, vocab)
    bitmask = rng.integers(-(2**31), 2**31, size=(8, -(-vocab // 32)), dtype=np.int64)
    bitmask = bitmask.astype(np.int32)
    bitmask[[1, 4, 5]] = -1  # unguided rows allow every token
    masks = StepMasks(0, [0, 2, 3, 6, 7], bitmask)
    on_cpu, on_gpu = logits.clone(), logits.cuda()
    apply_grammar_masks(on_cpu, refused_tokens(masks, on_cpu.device, vocab))
    apply_grammar_masks(on_gpu, refused_tokens(masks, on_gpu.device, vocab))
    assert torch.equal(on_gpu.cpu(), on_cpu)
    assert torch.isinf(on_cpu[0]).any() and not torch.isinf(on_cpu[1]).any()


@pytest.mark.parametrize("speculative", ["", "ngram"])
def test_random_weights_write_valid_json_through_graphs(model_dir: Path, speculative: str) -> None:
    overrides = {"speculative.method": speculative, "speculative.dynamic": False}
    with make_engine(model_dir, **overrides) as engine:
        assert engine.executor.runner.graphs is not None  # decode steps replay graphs
        prompt = engine.encode("Describe a person as JSON.")
        schemas = [PERSON, PRODUCT] * 8
        params = [
            SamplingParams(
                max_tokens=600,
                temperature=1.0,
                seed=i,
                guided=GuidedParams(json_schema=schema, compact_json=i % 2 == 0),
            )
            for i, schema in enumerate(schemas)
        ]
        free = SamplingParams(max_tokens=64, temperature=1.0, seed=99, ignore_eos=True)
        completions = engine.generate([prompt] * 17, [*params, free])
    for completion, schema in zip(completions, schemas, strict=False):
        assert completion.finish_reason is FinishReason.STOP, completion.text
        value = json.loads(completion.text)
        assert set(value) == set(schema["required"])
    assert len(completions[-1].token_ids) == 64  # the unguided row ran to its length
