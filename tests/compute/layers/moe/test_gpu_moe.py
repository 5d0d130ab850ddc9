"""The fused experts on the GPU (`pytest -m gpu`) at a model's sizes (D=2048, I=768, E=128,
K=8, bfloat16) against the per-expert reference, from a decode step to a long prefill; and
captured in a CUDA graph, replayed on new routings as eager computes them."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.layers.moe.reference import reference_experts
from aioworker.compute.layers.moe.triton_experts import fused_experts
from tests.compute.layers.moe.test_triton_experts import (
    BF16_ERROR,
    Sizes,
    activations,
    relative_error,
    routing,
    weights,
)

pytestmark = pytest.mark.gpu

MODEL = Sizes(hidden=2048, inter=768, experts=128, top_k=8)


@pytest.fixture(scope="module")
def dense() -> dict[str, torch.Tensor]:
    return weights(torch.bfloat16, MODEL)  # 1.2 GB: made once for the module


@pytest.mark.parametrize("load", ["uniform", "skewed", "sparse", "dropped"])
@pytest.mark.parametrize("num_tokens", [1, 64, 256, 1024, 4096])
def test_bf16_equals_the_reference_at_a_models_sizes(dense, num_tokens, load) -> None:
    x = activations(num_tokens, torch.bfloat16, MODEL)
    ids, routing_weights = routing(num_tokens, load, MODEL, seed=num_tokens)
    got = fused_experts(x, **dense, topk_ids=ids, topk_weights=routing_weights)
    want = reference_experts(x, **dense, topk_ids=ids, topk_weights=routing_weights)
    assert relative_error(got, want) < BF16_ERROR, (num_tokens, load)
    if load == "dropped":
        assert (got[0] == 0).all()


@pytest.mark.parametrize("quantized", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_quantized_weights_equal_the_reference_at_a_models_sizes(quantized) -> None:
    w = weights(torch.bfloat16, MODEL, quantized)
    for num_tokens in (1, 256):
        x = activations(num_tokens, torch.bfloat16, MODEL)
        ids, routing_weights = routing(num_tokens, "uniform", MODEL)
        got = fused_experts(x, **w, topk_ids=ids, topk_weights=routing_weights)
        want = reference_experts(x, **w, topk_ids=ids, topk_weights=routing_weights)
        assert relative_error(got, want) < BF16_ERROR, num_tokens


@pytest.mark.parametrize("num_tokens", [1, 64, 1024])  # 1024: a long sort too
def test_a_captured_graph_replays_new_routings_as_eager_computes_them(dense, num_tokens) -> None:
    x = activations(num_tokens, torch.bfloat16, MODEL)
    ids, routing_weights = routing(num_tokens, "uniform", MODEL)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused_experts(
            x, **dense, topk_ids=ids, topk_weights=routing_weights
        )  # compiles, off-stream
        with torch.cuda.graph(graph):
            captured = fused_experts(x, **dense, topk_ids=ids, topk_weights=routing_weights)
    torch.cuda.current_stream().wait_stream(stream)
    # The grid is sized for any routing: skewed, dropped and sparse ones replay in the graph
    # captured on a uniform one.
    for seed, load in [(3, "skewed"), (4, "dropped"), (5, "sparse")]:
        new_x = activations(num_tokens, torch.bfloat16, MODEL, seed=seed)
        new_ids, new_weights = routing(num_tokens, load, MODEL, seed=seed)
        x.copy_(new_x)
        ids.copy_(new_ids)
        routing_weights.copy_(new_weights)
        graph.replay()
        eager = fused_experts(new_x, **dense, topk_ids=new_ids, topk_weights=new_weights)
        assert torch.equal(captured, eager), load  # no atomics: the same bits
        want = reference_experts(new_x, **dense, topk_ids=new_ids, topk_weights=new_weights)
        assert relative_error(captured, want) < BF16_ERROR
