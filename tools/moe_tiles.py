"""Time the fused experts (grouping, both grouped GEMMs and the combine, replayed from a CUDA
graph as a decode step runs them) for tile choices at decode and prefill token counts, on one
Qwen3-30B-A3B layer's experts; prints a table per token count. GPU only:
`python tools/moe_tiles.py` (`--formats`: the chosen tiles with bf16, int8 and fp8 experts). What it found chose moe/triton_experts.py's block_sizes."""

from __future__ import annotations

import sys

import torch

from aioworker.bench.gpu_spec import replay_ms
from aioworker.checkpoint.model_config import load_model_config
from aioworker.compute.layers.moe import triton_experts
from aioworker.compute.layers.moe.routing import route
from aioworker.compute.layers.moe.triton_experts import BlockSizes, fused_experts

TILES = {
    "decode": [
        BlockSizes(16, 64, 128, 4),
        BlockSizes(16, 32, 128, 4),
        BlockSizes(16, 64, 256, 4),
        BlockSizes(16, 32, 256, 4, 4),
        BlockSizes(16, 128, 64, 4),
        BlockSizes(16, 64, 128, 4, 5),
        BlockSizes(16, 32, 64, 2, 4),
    ],
    "middle": [
        BlockSizes(32, 64, 64, 4),
        BlockSizes(16, 64, 128, 4),
        BlockSizes(32, 64, 128, 4),
        BlockSizes(32, 128, 64, 4),
        BlockSizes(64, 64, 64, 4),
    ],
    "prefill": [
        BlockSizes(64, 128, 64, 8),
        BlockSizes(128, 128, 64, 8),
        BlockSizes(64, 128, 128, 8, 3),
        BlockSizes(128, 128, 64, 8, 4),
        BlockSizes(64, 64, 64, 4, 4),
        BlockSizes(128, 256, 64, 8, 2),
    ],
}
TOKENS = {1: "decode", 8: "decode", 32: "decode", 64: "middle", 256: "middle", 4096: "prefill"}


def graph_ms(fn) -> float:
    """Mean device time of `fn` captured once in a CUDA graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return replay_ms(graph, 50)


def formats(w13: torch.Tensor, w2: torch.Tensor, moe, h: int) -> None:
    """The chosen tiles with the experts in bf16, int8 and fp8 (per-channel scales)."""
    from aioworker.compute.layers.moe.storage import FORMATS, ExpertStorage

    stored = {"bf16": (w13, w2, None, None)}
    for name in ("wint8", "fp8"):
        storage = ExpertStorage(FORMATS[name])
        (q13, s13), (q2, s2) = storage.quantize(w13), storage.quantize(w2)
        stored[name] = (q13, q2, s13, s2)
    print("\n| tokens | experts | graph ms |")
    print("| --- | --- | --- |")
    g = torch.Generator(device="cuda").manual_seed(1)
    for tokens in (1, 64, 256, 4096):
        x = torch.randn(tokens, h, device="cuda", generator=g).bfloat16()
        weights, ids = route(torch.randn(tokens, moe.num_experts, device="cuda", generator=g), moe)
        for name, (a, b, sa, sb) in stored.items():
            ms = graph_ms(
                lambda x=x, a=a, b=b, sa=sa, sb=sb, ids=ids, weights=weights: fused_experts(
                    x, a, b, ids, weights, sa, sb
                )
            )
            print(f"| {tokens} | {name} | {ms:.4f} |", flush=True)


def main() -> int:
    cfg = load_model_config("configs/models/qwen3-30b-a3b")
    moe, h = cfg.moe, cfg.hidden_size
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = (
        torch.randn(moe.num_experts, 2 * moe.intermediate_size, h, device="cuda", generator=g)
        * 0.02
    ).bfloat16()
    w2 = (
        torch.randn(moe.num_experts, h, moe.intermediate_size, device="cuda", generator=g) * 0.02
    ).bfloat16()
    expert_bytes = 3 * h * moe.intermediate_size * 2
    if "--formats" in sys.argv:
        formats(w13, w2, moe, h)
        return 0
    print("| tokens | tiles (m, n, k, warps, stages) | graph ms | TB/s of experts read |")
    print("| --- | --- | --- | --- |")
    for tokens, kind in TOKENS.items():
        x = (torch.randn(tokens, h, device="cuda", generator=g)).bfloat16()
        weights, ids = route(torch.randn(tokens, moe.num_experts, device="cuda", generator=g), moe)
        hit = len(torch.unique(ids))
        for tiles in TILES[kind]:
            triton_experts.block_sizes = lambda *_, tiles=tiles: tiles
            try:
                ms = graph_ms(
                    lambda x=x, ids=ids, weights=weights: fused_experts(x, w13, w2, ids, weights)
                )
            except Exception as exc:  # a tile that does not fit: say so and go on
                print(
                    f"| {tokens} | {tuple(tiles)} | failed: {type(exc).__name__} | - |", flush=True
                )
                continue
            print(
                f"| {tokens} | {tuple(tiles)} | {ms:.4f} | {hit * expert_bytes / ms / 1e9:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
