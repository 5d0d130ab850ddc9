"""The small-rows method inside a whole model: decode's products of 1 to 8 rows go through the
kernels (gate/up with SiLU fused, and with device.fused_norm_products the residual add and
RMSNorm before qkv and gate/up), prefill through the wrapped method, and greedy tokens equal the
model without them (CPU, float32, Triton's interpreter; on the GPU with -m gpu too)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.layers.gemv import product  # noqa: E402
from aioworker.compute.layers.gemv.method import SmallRows, small_rows  # noqa: E402
from aioworker.compute.layers.gemv.tiles import MAX_ROWS  # noqa: E402
from aioworker.compute.layers.linear_method import UNQUANTIZED, methods_in  # noqa: E402
from aioworker.core.sampling_params import SamplingParams  # noqa: E402
from tests.conftest import make_engine  # noqa: E402
from tests.tiny_models import build_tiny_model  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernels run
SETTINGS = {"cache.num_blocks": 64, "model.max_model_len": 256, "device.cpu_packed_weights": False}


def greedy(
    model_dir, prompts, kernels: bool, fuse_norm=False, norm_finish=False, early_loads=False
):
    switches = {
        "device.small_batch_kernels": kernels,
        "device.fused_norm_products": fuse_norm,
        "device.norms_in_product_finish": norm_finish,
        "device.early_epilogue_loads": early_loads,
    }
    engine = make_engine(model_dir, **SETTINGS, **switches)
    try:
        wrapped = [m for _, m in methods_in(engine.executor.runner.model)]
        # (an MoE model's experts and router multiply through methods of their own)
        assert any(isinstance(m, SmallRows) for m in wrapped) == kernels
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        return [c.token_ids for c in engine.generate(prompts, params)]
    finally:
        engine.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases, a tied LM head
def test_greedy_tokens_equal_the_model_without_the_kernels(arch, tmp_path, monkeypatch) -> None:
    build_tiny_model(arch, tmp_path, logit_scale=4.0)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 384, (n,), generator=g).tolist() for n in (5, 17, 30)]
    want = greedy(tmp_path, prompts, kernels=False)
    calls = []
    real = product.small_rows_product

    def counted(x, weight, tiles, scale=None, gated=False, bias=None, int4_groups=None,
                add_norm=None, norm_out=None, prenormed=None, early_loads=False):  # fmt: skip
        normed = "none" if add_norm is None else "add" if add_norm.residual is not None else "norm"
        calls.append((x.shape[0], gated, bias is not None, normed))
        assert norm_out is None and prenormed is None  # device.norms_in_product_finish is off
        return real(x, weight, tiles, scale, gated, bias, int4_groups, add_norm,
                    early_loads=early_loads)  # fmt: skip

    monkeypatch.setattr(product, "small_rows_product", counted)
    assert greedy(tmp_path, prompts, kernels=True) == want
    # The three decode together, never a prefill; on CUDA padded to a captured graph's size.
    assert 3 <= max(rows for rows, _, _, _ in calls) <= MAX_ROWS
    assert any(gated for _, gated, _, _ in calls)
    assert any(bias for _, _, bias, _ in calls) == (arch == "qwen2")
    assert {normed for *_, normed in calls} == {"none"}
    calls.clear()
    assert greedy(tmp_path, prompts, kernels=True, fuse_norm=True) == want
    # The first layer norms its input (no residual yet); every other add and norm is fused in.
    assert {(gated, normed) for _, gated, _, normed in calls} == {
        (False, "norm"),
        (False, "add"),
        (True, "add"),
        (False, "none"),
    }


# qwen2: q/k/v biases after the norm; qwen3_moe: routed experts, whose router takes the norm's
# row itself (the o product still starts it; the norm is then finished on its own)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3_moe"])
def test_norms_split_between_the_products_keep_the_greedy_tokens(arch, tmp_path, monkeypatch):
    """device.norms_in_product_finish: the o and down products start the norm after them
    (NormOut) and the gate/up and next qkv products finish it (PreNormed), so that of a decode
    step's norms only the first layer's input norm and the final norm run on their own. Greedy
    tokens equal the model without the kernels (float32)."""
    from aioworker.compute.layers.norm import RMSNorm

    build_tiny_model(arch, tmp_path, logit_scale=4.0)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 384, (n,), generator=g).tolist() for n in (4, 19)]
    norms = []
    real_norm = RMSNorm.forward
    monkeypatch.setattr(RMSNorm, "forward", lambda self, x: norms.append(1) or real_norm(self, x))
    want = greedy(tmp_path, prompts, kernels=False)
    norms_without = len(norms)
    kinds = []
    real = product.small_rows_product

    def counted(x, weight, tiles, scale=None, gated=False, bias=None, int4_groups=None,
                add_norm=None, norm_out=None, prenormed=None, early_loads=False):  # fmt: skip
        kinds.append("start" if norm_out else "finish" if prenormed else "plain")
        return real(x, weight, tiles, scale, gated, bias, int4_groups, add_norm, norm_out,
                    prenormed, early_loads)  # fmt: skip

    monkeypatch.setattr(product, "small_rows_product", counted)
    norms.clear()
    assert greedy(tmp_path, prompts, kernels=True, norm_finish=True) == want
    # Each of 11 decode steps, 2 layers: o starts the post-attention norm, gate/up finishes it;
    # layer 1's down starts layer 2's input norm, its qkv finishes it; layer 2's down, the last,
    # goes into the final norm. So 3 of a step's 5 norms run inside the products.
    steps = 11
    if arch == "qwen3_moe":  # the experts' blocks finish theirs on their own
        assert kinds.count("start") > kinds.count("finish") > 0
        assert len(norms) < norms_without
        return
    assert kinds.count("start") == kinds.count("finish") == 3 * steps
    assert len(norms) == norms_without - 3 * steps


def test_early_epilogue_loads_reach_every_product_and_keep_the_greedy_tokens(tmp_path, monkeypatch):
    """device.early_epilogue_loads, with the norms split between the products (the reduce
    kernel's and the finishes' every epilogue): greedy tokens equal the model without the
    kernels (float32), and every product was asked for it, the LM head's too."""
    build_tiny_model("llama", tmp_path, logit_scale=4.0)
    prompts = [[5, 9, 2, 7], list(range(30, 49))]
    want = greedy(tmp_path, prompts, kernels=False)
    asked = []
    real = product.small_rows_product

    def counted(*args, early_loads=False, **kwargs):
        asked.append(early_loads)
        return real(*args, early_loads=early_loads, **kwargs)

    monkeypatch.setattr(product, "small_rows_product", counted)
    assert greedy(tmp_path, prompts, kernels=True, norm_finish=True, early_loads=True) == want
    assert asked and all(asked)


def test_more_rows_than_the_kernels_take_go_to_the_wrapped_method(monkeypatch) -> None:
    layer = torch.nn.Module()
    method = small_rows(UNQUANTIZED)
    method.create_weights(layer, 24, 16)
    layer.weight.data = torch.randn(24, 16)
    layer.bias = None
    monkeypatch.setattr(product, "small_rows_product", None)  # would fail if called
    x = torch.randn(9, 16)
    torch.testing.assert_close(method.apply(layer, x), x @ layer.weight.T)
    gate, up = (x @ layer.weight.T).chunk(2, dim=-1)
    torch.testing.assert_close(method.apply_gated(layer, x), torch.nn.functional.silu(gate) * up)


def test_a_tiling_out_of_shared_memory_retries_with_fewer_stages_then_gives_up(monkeypatch):
    """Fewer pipeline stages, remembered for the next product; torch's product where even one
    stage does not fit."""
    from triton.runtime.errors import OutOfResources

    layer = torch.nn.Module()
    method = small_rows(UNQUANTIZED)
    method.create_weights(layer, 24, 16)
    layer.weight.data = torch.randn(24, 16, device=DEVICE)
    layer.bias = None
    stages_tried = []

    def fits_below(limit):
        def launch(x, weight, tiles, *rest, **options):
            stages_tried.append(tiles.num_stages)
            if tiles.num_stages > limit:
                raise OutOfResources(1, 0, "shared memory")
            return x @ weight.T

        return launch

    x = torch.randn(1, 16, device=DEVICE)
    monkeypatch.setattr(product, "small_rows_product", fits_below(2))
    for _ in range(2):
        torch.testing.assert_close(method.apply(layer, x), x @ layer.weight.T)
    first = stages_tried[0]
    assert first > 2 and stages_tried == [first, 2, 2]  # the second call: the fitted stages
    monkeypatch.setattr(product, "small_rows_product", fits_below(0))
    method.fitted.clear()
    stages_tried.clear()
    torch.testing.assert_close(method.apply(layer, x), x @ layer.weight.T)  # torch's product
    assert stages_tried == [first, 2, 1]


def test_formats_without_kernels_are_left_as_they_are() -> None:
    class Other:
        name = "wint4"

    other = Other()
    assert small_rows(other) is other
    assert small_rows(small_rows(UNQUANTIZED)).inner is UNQUANTIZED


def test_a_weights_update_is_multiplied_by_the_kernels(tmp_path) -> None:
    """The kernels read the layer's tensors at each call: after stage and commit, greedy tokens
    are the new weights' (a fresh engine without the kernels), the add and norm fused in too."""
    from aioworker.core.weights_phase import WeightsPhase

    build_tiny_model("qwen3", tmp_path / "old", seed=0, logit_scale=4.0)
    build_tiny_model("qwen3", tmp_path / "new", seed=1, logit_scale=4.0)
    prompts = [[3, 4, 5], [10, 11, 12, 13, 14, 15]]
    want = greedy(tmp_path / "new", prompts, kernels=False)
    switches = {"device.small_batch_kernels": True, "device.fused_norm_products": True}
    engine = make_engine(tmp_path / "old", **SETTINGS, **switches)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        before = [c.token_ids for c in engine.generate(prompts, params)]
        for phase in (
            WeightsPhase(op="stage", path=str(tmp_path / "new")),
            WeightsPhase(op="commit"),
        ):
            assert engine.executor.run_weights_phase(phase).result() == 0
        assert [c.token_ids for c in engine.generate(prompts, params)] == want != before
    finally:
        engine.close()


@pytest.mark.parametrize("fmt", ["wint8", "wint4"])
def test_an_lm_heads_quantized_copy_multiplies_on_the_kernels(fmt, monkeypatch) -> None:
    """model.quantize_lm_head on a GPU: the kernels read the copy's operands, not the dense
    weight the head keeps."""
    from aioworker.compute.layers.embedding import ParallelLMHead
    from aioworker.compute.layers.linear_method import process_after_loading
    from aioworker.compute.layers.quantized.head_copy import QuantizedCopy
    from aioworker.compute.layers.quantized.weight_only import WINT4_ON_LOAD, WINT8_ON_LOAD
    from aioworker.compute.parallel import SINGLE

    inner = QuantizedCopy({"wint8": WINT8_ON_LOAD, "wint4": WINT4_ON_LOAD}[fmt])
    method = small_rows(inner)
    assert isinstance(method, SmallRows)
    layer = ParallelLMHead(80, 128, SINGLE, method).to(DEVICE)
    layer.weight.data = torch.randn(80, 128, device=DEVICE)
    process_after_loading(layer)
    read = []
    real = product.small_rows_product
    monkeypatch.setattr(product, "small_rows_product",
                        lambda x, w, *rest, **kw: read.append(w.dtype) or real(x, w, *rest, **kw))  # fmt: skip
    x = torch.randn(1, 128, device=DEVICE)
    want = inner.format.apply(inner.copy_of(layer), x)
    # On CUDA the format's own int4 product (tinygemm) takes x in bf16: a looser bound there.
    atol = 1e-1 if DEVICE == "cuda" else 5e-2
    torch.testing.assert_close(layer.compute_logits(x), want, rtol=2e-2, atol=atol)
    assert read and read[0] != torch.float32  # the copy's int8 values or int4 words
