"""The fused experts (triton_experts.py) against the per-expert reference, and the grouping of
choices by expert (align.py) they rest on. Triton's interpreter on a CPU machine, at sizes that
are no multiple of the tiles; on the GPU machine for real (and test_gpu_moe.py, -m gpu)."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import pytest
import torch

pytest.importorskip("triton")  # the interpreter is chosen in conftest.py

from aioworker.compute.layers.moe import align  # noqa: E402
from aioworker.compute.layers.moe.align import align_by_expert, max_padded_rows  # noqa: E402
from aioworker.compute.layers.moe.reference import reference_experts  # noqa: E402
from aioworker.compute.layers.moe.triton_experts import block_sizes, fused_experts  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOADS = ["uniform", "skewed", "sparse", "dropped"]


class Sizes(NamedTuple):
    hidden: int  # D
    inter: int  # I
    experts: int  # E
    top_k: int  # K


SMALL = Sizes(hidden=48, inter=40, experts=8, top_k=2)  # D and I under one tile, not a power of 2


def routing(
    num_tokens: int, load: str, sizes: Sizes = SMALL, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [T, K], topk_weights [T, K]), K distinct experts a token, as a router picks:
    uniform; skewed (every token's first choice is one expert); sparse (a few experts get all,
    the first and last none); dropped (uniform, a third of the choices and all of token 0's
    computed on another rank: -1)."""
    g = torch.Generator().manual_seed(seed)
    num_experts, top_k = sizes.experts, sizes.top_k
    scores = torch.rand(num_tokens, num_experts, generator=g)
    if load == "skewed":
        scores[:, num_experts // 2] = 2.0
    if load == "sparse":
        scores[:, : num_experts // 2] -= 1.0
        scores[:, [0, -1]] -= 1.0
    ids = scores.topk(top_k, dim=-1).indices
    if load == "dropped":
        ids[torch.rand(num_tokens, top_k, generator=g) < 1 / 3] = -1
        ids[0] = -1
    weights = torch.rand(num_tokens, top_k, generator=g)
    return ids.to(DEVICE), weights.to(DEVICE)


def weights(
    dtype: torch.dtype, sizes: Sizes = SMALL, quantized: torch.dtype | None = None, seed: int = 1
) -> dict[str, torch.Tensor]:
    """w13 [E, 2I, D], w2 [E, D, I] (per-row scaled int8 or e4m3 with their scales when
    `quantized`), sized so that every product is about 1."""
    g = torch.Generator().manual_seed(seed)
    dims = {"w13": (2 * sizes.inter, sizes.hidden), "w2": (sizes.hidden, sizes.inter)}
    out = {}
    for name, (rows, cols) in dims.items():
        w = torch.randn(sizes.experts, rows, cols, generator=g) / cols**0.5
        if quantized is None:
            out[name] = w.to(dtype)
            continue
        top = 127.0 if quantized == torch.int8 else torch.finfo(quantized).max
        scale = w.abs().amax(dim=-1) / top  # [E, rows]
        q = w / scale[..., None]
        out[name] = (q.round() if quantized == torch.int8 else q).to(quantized)
        out[f"{name}_scale"] = scale
    return {name: t.to(DEVICE) for name, t in out.items()}


def activations(
    num_tokens: int, dtype: torch.dtype, sizes: Sizes = SMALL, seed: int = 2
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, sizes.hidden, generator=g).to(dtype).to(DEVICE)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference over the largest output (or over 1 where every output is 0: a
    token whose choices are all on another rank)."""
    scale = want.float().abs().max().item() or 1.0
    return (got.float() - want.float()).abs().max().item() / scale


# Half precision, relative to the largest output: on the GPU the kernel rounds where the reference
# rounds, and the two differ by the order of their float32 sums (an ulp now and then in an
# intermediate). The interpreter's casts to bfloat16 truncate (triton 3.9), each of the five
# rounded intermediates (gate, up, SiLU, its product, an expert's output) pulling towards zero
# by up to an ulp (2^-8): about 2.5% at most on these sizes.
BF16_ERROR = 0.015 if DEVICE == "cuda" else 0.05


@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("load", LOADS)
def test_align_places_every_choice_once_in_blocks_of_one_expert(load, block_m) -> None:
    num_tokens = 37
    ids, _ = routing(num_tokens, load)
    sorted_ids, block_experts, num_blocks = align_by_expert(ids, SMALL.experts, block_m)
    num_choices = ids.numel()
    assert sorted_ids.shape == (max_padded_rows(num_choices, SMALL.experts, block_m),)
    assert block_experts.shape == (sorted_ids.shape[0] // block_m,)
    flat_ids = ids.reshape(-1).cpu()
    sorted_ids, block_experts = sorted_ids.cpu(), block_experts.cpu()
    used = int(num_blocks.item()) * block_m
    placed = sorted_ids[sorted_ids < num_choices]
    valid = torch.nonzero(flat_ids >= 0).flatten()
    assert sorted(placed.tolist()) == valid.tolist()  # each kept choice once, dropped ones never
    assert (sorted_ids[used:] == num_choices).all()  # nothing past the used blocks
    blocks = sorted_ids[:used].reshape(-1, block_m)
    for block, expert in zip(blocks, block_experts[: len(blocks)].tolist(), strict=True):
        choices = block[block < num_choices]
        assert len(choices) > 0  # no block of padding alone
        assert (flat_ids[choices] == expert).all()
    for expert in range(SMALL.experts):
        num_rows = int((block_experts[: len(blocks)] == expert).sum()) * block_m
        count = int((flat_ids == expert).sum())
        assert count <= num_rows < count + block_m  # padded to its own blocks, not the largest
    assert (block_experts[len(blocks) :] == SMALL.experts).all()


def test_align_needs_no_host_synchronisation() -> None:
    # The CPU cannot see a synchronisation; the GPU tests capture the kernel in a CUDA graph.
    source = inspect.getsource(align)
    for syncing in (".item(", ".tolist(", "nonzero", "bincount", ".cpu(", "repeat_interleave"):
        assert syncing not in source


def test_block_sizes_grow_with_the_rows_an_expert_gets() -> None:
    def block_m(num_tokens: int) -> int:
        return block_sizes(num_tokens * 8, num_experts=128, dtype=torch.bfloat16).block_m

    assert block_m(1) == block_m(64) == 16  # decode steps
    assert block_m(256) == block_m(512) == 32
    assert block_m(1024) == block_m(4096) == 128  # prefill
    bf16, fp32 = (block_sizes(4096 * 8, 128, dtype) for dtype in (torch.bfloat16, torch.float32))
    assert fp32.block_k * 4 == bf16.block_k * 2  # the same shared memory a stage


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("num_tokens", [1, 3, 17, 64])
def test_float32_equals_the_reference(num_tokens, load) -> None:
    x = activations(num_tokens, torch.float32)
    ids, routing_weights = routing(num_tokens, load, seed=num_tokens)
    w = weights(torch.float32)
    got = fused_experts(x, w["w13"], w["w2"], ids, routing_weights)
    want = reference_experts(x, w["w13"], w["w2"], ids, routing_weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if load == "dropped":
        assert (got[0] == 0).all()  # every choice on another rank: nothing added here


@pytest.mark.parametrize("num_tokens", [128, 300])
def test_prefill_tiles_equal_the_reference(num_tokens) -> None:
    # 32 and 75 rows an expert: the taller tiles, several blocks for the skewed expert
    x = activations(num_tokens, torch.float32)
    ids, routing_weights = routing(num_tokens, "skewed")
    w = weights(torch.float32)
    got = fused_experts(x, w["w13"], w["w2"], ids, routing_weights)
    want = reference_experts(x, w["w13"], w["w2"], ids, routing_weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("num_tokens", "load", "dtype"),
    [
        (3, "uniform", torch.bfloat16),
        (64, "skewed", torch.bfloat16),
        (17, "dropped", torch.bfloat16),
        (17, "sparse", torch.float16),
    ],
)
def test_half_precision_equals_the_reference(num_tokens, load, dtype) -> None:
    x = activations(num_tokens, dtype)
    ids, routing_weights = routing(num_tokens, load)
    w = weights(dtype)
    got = fused_experts(x, w["w13"], w["w2"], ids, routing_weights)
    want = reference_experts(x, w["w13"], w["w2"], ids, routing_weights)
    assert got.dtype == dtype
    assert relative_error(got, want) < BF16_ERROR


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quantized", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
@pytest.mark.parametrize("num_tokens", [3, 64])
def test_quantized_weights_equal_the_reference(num_tokens, quantized, dtype) -> None:
    x = activations(num_tokens, dtype)
    ids, routing_weights = routing(num_tokens, "dropped")
    w = weights(dtype, quantized=quantized)
    got = fused_experts(x, **w, topk_ids=ids, topk_weights=routing_weights)
    want = reference_experts(x, **w, topk_ids=ids, topk_weights=routing_weights)
    if dtype == torch.float32:  # the reference scales the weight, the kernel the product
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert relative_error(got, want) < BF16_ERROR


def test_quantized_weights_without_scales_are_refused() -> None:
    x = activations(3, torch.float32)
    ids, routing_weights = routing(3, "uniform")
    w = weights(torch.float32, quantized=torch.int8)
    with pytest.raises(ValueError, match="w13_scale is None"):
        fused_experts(x, w["w13"], w["w2"], ids, routing_weights)


def test_no_tokens_give_no_rows() -> None:
    ids, routing_weights = routing(0, "uniform")
    w = weights(torch.float32)
    out = fused_experts(activations(0, torch.float32), w["w13"], w["w2"], ids, routing_weights)
    assert out.shape == (0, SMALL.hidden)
