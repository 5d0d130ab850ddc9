"""Quantized weights on the GPU (`pytest -m gpu`): each format quantized while loading multiplies
as its dequantized weight does, on the kernels' few rows and the dequantizing path, and the same
inside a CUDA graph; quantized checkpoints read back their dequantized weights through the
device's own products (the block-scaled one where the device has it); a quantized engine's
graphs, release and resume keep its tokens; and wint8 keeps them with PDL, which it launches
without by default. (The embedded model is not on the GPU machine: its file is past what a run
may carry; fp8's accuracy on it is measured through torch's CPU product,
tests/test_quantization.py.)"""

from __future__ import annotations

import functools

import pytest
import torch

from aioworker.compute.layers import pdl
from aioworker.compute.layers.linear_method import process_after_loading
from aioworker.compute.layers.quantized import fp8
from aioworker.compute.layers.quantized.weight_only import WINT4_ON_LOAD, WINT8_ON_LOAD
from aioworker.core.sampling_params import SamplingParams
from tests.compute.layers import test_quantized_on_load as on_load
from tests.compute.layers.test_quantized_checkpoints import (
    SIZES,
    read_back,
    reference_weight,
)
from tests.compute.test_gpu import engine
from tests.quantized_checkpoints import layouts, write_quantized
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.gpu

METHODS = [fp8.FP8, WINT8_ON_LOAD, WINT4_ON_LOAD]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_a_format_quantized_on_load_multiplies_as_its_dequantized_weight(method) -> None:
    with torch.device("cuda"):
        module = on_load.merged_layer(method)
    on_load.load_parts(module, on_load.dense_parts())
    process_after_loading(module)
    layer = module.proj
    weights = on_load.dequantized(layer).cuda()
    for rows in (1, 3, 8, 16, 17, 64, 300):
        x = torch.randn(rows, 256, dtype=torch.bfloat16, device="cuda")
        expected = x.float() @ weights.t()
        error = (layer(x).float() - expected).abs().max() / expected.abs().max()
        assert error < (0.08 if method is fp8.FP8 else 0.02), (rows, error)
    x = torch.randn(1, 256, dtype=torch.bfloat16, device="cuda")
    eager = layer(x)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        layer(x)  # warm-up off the default stream, as capture requires
        with torch.cuda.graph(graph):
            captured = layer(x)
    graph.replay()
    torch.testing.assert_close(captured, eager)


@pytest.mark.parametrize("layout", list(layouts()))
def test_a_quantized_checkpoint_reads_back_on_the_gpu(tmp_path, layout) -> None:
    build_tiny_model("llama", tmp_path / "dense", logit_scale=4.0, **SIZES)
    write_quantized(tmp_path / "dense", layout, tmp_path / "quantized", tmp_path / "reference")
    from safetensors.torch import load_file

    reference = load_file(str(tmp_path / "reference" / "model.safetensors"))
    eng = engine(tmp_path / "quantized", **{"model.dtype": "bfloat16", "model.max_model_len": 256})
    try:
        block = eng.executor.runner.model.model.layers[0]
        for owner, name in (("self_attn", "qkv_proj"), ("mlp", "down_proj")):
            layer = getattr(getattr(block, owner), name)
            want = reference_weight(reference, f"model.layers.0.{owner}", name).cuda()
            for rows in (3, want.shape[1]):
                got = read_back(layer, want.shape[1], rows).float()
                atol = 2**-7 * want.abs().max().item()
                torch.testing.assert_close(got, want[:, :rows], rtol=2**-6, atol=atol)
        if "block" in layout:  # Hopper with CUDA >= 12.9: the block product, no dense copy,
            # where it is right (cuBLAS gets 256 inputs wrong: checked per layer at load)
            assert block.mlp.down_proj.block_layout is not None  # 512 inputs
            assert block.self_attn.qkv_proj.block_layout is None  # 256
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        [completion] = eng.generate([[5, 17, 200, 31, 9]], params)
        assert len(completion.token_ids) == 8
    finally:
        eng.close()


@pytest.mark.parametrize("quantize_lm_head", [False, True], ids=["dense-head", "quantized-head"])
@pytest.mark.parametrize("quantization", ["fp8", "wint8", "wint4"])
def test_a_quantized_engine_keeps_its_tokens_through_graphs_release_and_resume(
    tmp_path, quantization: str, quantize_lm_head: bool
) -> None:
    build_tiny_model("llama", tmp_path, logit_scale=4.0, **SIZES)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [100, 200, 300], list(range(40, 90))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = {}
    for graphs in (False, True):
        eng = engine(
            tmp_path,
            **{
                "model.dtype": "float32",
                "model.max_model_len": 256,
                "model.quantization": quantization,
                "model.quantize_lm_head": quantize_lm_head,
                "device.cuda_graphs": graphs,
            },
        )
        try:
            outputs[graphs] = [c.token_ids for c in eng.generate(prompts, params)]
            if graphs:
                memory = eng.executor.weights.memory
                eng.executor.call(functools.partial(memory.release, True, True)).result()
                eng.executor.call(memory.resume).result()
                eng.core.reset_prefix_cache()
                outputs["resumed"] = [c.token_ids for c in eng.generate(prompts, params)]
        finally:
            eng.close()
    assert outputs[True] == outputs[False] == outputs["resumed"]


def test_wint8_keeps_its_tokens_with_pdl(tmp_path) -> None:
    """wint8 launches without PDL by default (device.pdl_off_formats); `[]` gives it PDL, as W4
    compares on the GPU. Its graphs must then give the tokens it gives without."""
    build_tiny_model("llama", tmp_path, logit_scale=4.0, **SIZES)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [100, 200, 300]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs, switched = {}, {}
    for off in (["wint8"], []):
        eng = engine(
            tmp_path,
            **{
                "model.dtype": "float32",
                "model.max_model_len": 256,
                "model.quantization": "wint8",
                "device.pdl_off_formats": off,
            },
        )
        try:
            switched[bool(off)] = pdl.switched_on()
            outputs[bool(off)] = [c.token_ids for c in eng.generate(prompts, params)]
        finally:
            eng.close()
    assert switched == {True: False, False: torch.cuda.get_device_capability() >= (9, 0)}
    assert outputs[True] == outputs[False]
