"""compressed-tensors W4A16 checkpoints through the small-rows kernels: their int32 words and
group scales are read as loaded (no second copy), a few rows multiply as the dequantized weights
do, and greedy tokens equal torch's int4 path (CPU under Triton's interpreter, float32)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from safetensors.torch import load_file  # noqa: E402

from aioworker.compute.layers.gemv.method import SmallRows  # noqa: E402
from tests.compute.layers.test_quantized_checkpoints import (  # noqa: E402
    SETTINGS,
    SIZES,
    generate,
    read_back,
    reference_weight,
)
from tests.conftest import make_engine  # noqa: E402
from tests.quantized_checkpoints import write_quantized  # noqa: E402
from tests.tiny_models import build_tiny_model  # noqa: E402

KERNELS = {"device.small_batch_kernels": True, "device.cpu_packed_weights": False}


@pytest.mark.parametrize("layout", ["ct-w4a16", "ct-w4a16-asym"])
def test_w4a16_words_multiply_as_their_dequantized_weights(tmp_path, layout) -> None:
    build_tiny_model("llama", tmp_path / "dense", logit_scale=4.0, **SIZES)
    write_quantized(tmp_path / "dense", layout, tmp_path / "quantized", tmp_path / "reference")
    reference = load_file(str(tmp_path / "reference" / "model.safetensors"))
    outputs = []
    for kernels in (False, True):
        switch = KERNELS | {"device.small_batch_kernels": kernels}
        engine = make_engine(tmp_path / "quantized", **SETTINGS, **switch)
        try:
            block = engine.executor.runner.model.model.layers[1]
            for owner, name in (("self_attn", "qkv_proj"), ("mlp", "down_proj")):
                layer = getattr(getattr(block, owner), name)
                assert isinstance(layer.linear_method, SmallRows) == kernels
                want = reference_weight(reference, f"model.layers.1.{owner}", name)
                got = read_back(layer, want.shape[1], 3).cpu()
                atol = 2**-8 * want.abs().max().item()  # offsets held in bfloat16
                torch.testing.assert_close(got, want[:, :3], rtol=2**-7, atol=atol)
            outputs.append(generate(engine))
        finally:
            engine.close()
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(*outputs, strict=True):
        assert tokens == want_tokens
        for entry, want in zip(logprobs, want_logprobs, strict=True):
            assert abs(entry.logprob - want.logprob) < 0.1  # torch's path rounds rows to bf16


def test_norms_split_between_int4_products_keep_the_greedy_tokens(tmp_path, monkeypatch) -> None:
    """A quantized format's kernels start the norm after the o and down products and finish it
    in the next (device.norms_in_product_finish, on by default) as dense ones do: greedy tokens
    and logprobs equal the same kernels with every norm run on its own."""
    from aioworker.compute.layers.gemv import product

    build_tiny_model("llama", tmp_path / "dense", logit_scale=4.0, **SIZES)
    write_quantized(tmp_path / "dense", "ct-w4a16-asym", tmp_path / "quantized", tmp_path / "ref")
    kinds = []
    real = product.small_rows_product

    def counted(x, weight, tiles, scale=None, gated=False, bias=None, int4_groups=None,
                add_norm=None, norm_out=None, prenormed=None, early_loads=False):  # fmt: skip
        if int4_groups is not None:  # the projections, not the dense LM head
            kinds.append("start" if norm_out else "finish" if prenormed else "plain")
        return real(x, weight, tiles, scale, gated, bias, int4_groups, add_norm, norm_out,
                    prenormed, early_loads)  # fmt: skip

    monkeypatch.setattr(product, "small_rows_product", counted)
    outputs = []
    for norm_finish in (False, True):
        switches = KERNELS | {"device.norms_in_product_finish": norm_finish}
        engine = make_engine(tmp_path / "quantized", **SETTINGS, **switches)
        try:
            outputs.append(generate(engine))
        finally:
            engine.close()
        assert ("start" in kinds) == ("finish" in kinds) == norm_finish
        kinds.clear()
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(*outputs, strict=True):
        assert tokens == want_tokens
        for entry, want in zip(logprobs, want_logprobs, strict=True):
            assert abs(entry.logprob - want.logprob) < 1e-3  # float32 on both sides
