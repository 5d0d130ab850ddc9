"""Paged decode attention alone, on the GPU: our Triton kernel against xformers' triton_splitk,
in KV bytes read per second beside the measured copy bandwidth (the floor).

    python tools/bench_decode_kernel.py [--seqs 1 64 256] [--context 4096] [--heads 32]
        [--warps 4] [--max-model-len 4096] [--spread] [--splits 1 2 4]
        [--variants 4:-:64:seq 4:5:64:heads] [--tables scattered ordered] [--pages 16]

--heads: query heads over 8 KV heads x 128 (32: Llama-3.1-8B, 16: Qwen3-0.6B). --warps: our
kernel's warps a program, each a row of the table (triton_decode.DECODE_WARPS). --pages: the
cache's block sizes (default 16, the engine's, and 64, xformers' least). --spread: each sequence's context drawn uniformly from a quarter to seven
quarters of --context (mean --context), as W1's large decode steps have them: e.g. --heads 16
--seqs 202 --context 811 --max-model-len 2048 --spread. --splits: splits of each sequence's
context to time, each a row (default: the engine's choice, choose_num_splits); with spread
contexts, more splits shorten the longest programs, which end each launch.
--variants: kernel builds to time, each WARPS:STAGES:TILE:ORDER (STAGES `-`: Triton's default;
ORDER `seq`: a KV head's programs neighbours, the default, or `heads`: a sequence's); given, it
replaces --warps. --tables: `scattered` (the default) draws each sequence's blocks at random,
as a long-running cache has them; `ordered` gives each sequence consecutive blocks, as a fresh
cache does.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch

from aioworker.bench.gpu import _copy_bytes_per_s
from aioworker.bench.gpu_spec import replay_ms
from aioworker.bench.report import format_table
from aioworker.compute.layers.attention.triton_decode import (
    DECODE_WARPS,
    DecodeBuild,
    choose_num_splits,
    paged_decode,
)


def contexts(num_seqs: int, context: int, spread: bool) -> torch.Tensor:
    """Each sequence's context: `context`, or with `spread` uniform in [context / 4, 7 context /
    4] (seeded, so every run and kernel sees the same draws)."""
    if not spread:
        return torch.full((num_seqs,), context, dtype=torch.int32)
    low = max(1, context // 4)
    generator = torch.Generator().manual_seed(0)
    return torch.randint(low, 2 * context - low + 1, (num_seqs,), generator=generator).int()


def cache(
    num_seqs: int, context: int, block_size: int, heads_kv: int, head_dim: int, scattered: bool
):
    """Caches and block tables for `num_seqs` sequences of up to `context` tokens, their blocks
    drawn at random (`scattered`) or consecutive."""
    blocks_per_seq = -(-context // block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, heads_kv, head_dim)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    order = torch.randperm if scattered else torch.arange
    tables = order(num_blocks, device="cuda").view(num_seqs, blocks_per_seq).int()
    return k, v, tables


def parse_build(text: str) -> DecodeBuild:
    """WARPS:STAGES:TILE:ORDER (STAGES `-`: Triton's default; ORDER seq or heads)."""
    warps, stages, tile, order = text.split(":")
    if order not in ("seq", "heads"):
        raise SystemExit(f"--variants {text}: ORDER is seq or heads")
    stages = None if stages == "-" else int(stages)
    return DecodeBuild(int(warps), stages, int(tile), order == "heads")


def describe(build: DecodeBuild) -> str:
    stages = "default" if build.stages is None else build.stages
    order = ", heads first" if build.heads_first else ""
    return f"{build.warps} warps, stages {stages}, tile {build.tile}{order}"


def ours(q, k, v, tables, lens, splits, build: DecodeBuild):
    scale = q.shape[-1] ** -0.5
    return lambda: paged_decode(q, k, v, tables, lens, scale, splits, build=build)


def graph_seconds(fn, replays: int = 20, repeats: int = 10) -> float:
    """Median seconds of one `fn`, captured in a CUDA graph and replayed `replays` times between
    two events, as the engine's decode graphs run it. Timed eagerly instead, each call would
    carry its host launch (tens of microseconds through Triton's launcher) in the time: the
    tables before 2026-12-06 18:30 did. A context that fits in L2 (50 MB) is read from it on
    the replays after the first, so rows of a few sequences overstate the DRAM rate."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles, and warms the allocator, outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = [replay_ms(graph, replays) / 1000 for _ in range(repeats)]
    return statistics.median(times)


def xformers(q, k, v, tables, lens, block_size):
    from xformers.ops import fmha

    num_seqs, num_heads, head_dim = q.shape
    heads_kv = k.shape[2]
    group = num_heads // heads_kv
    mask = fmha.attn_bias.PagedBlockDiagonalPaddedKeysMask.from_seqlens(
        q_seqlen=[1] * num_seqs, kv_seqlen=lens.tolist(), block_tables=tables, page_size=block_size
    )
    shape = (1, -1, heads_kv, group, head_dim)
    keys = k.view(1, -1, heads_kv, 1, head_dim).expand(shape)
    values = v.view(1, -1, heads_kv, 1, head_dim).expand(shape)
    q5 = q.view(1, num_seqs, heads_kv, group, head_dim)
    return lambda: fmha.memory_efficient_attention_forward(
        q5, keys, values, attn_bias=mask, op=fmha.triton_splitk.FwOp
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--context", type=int, nargs="+", default=[4096])
    parser.add_argument("--heads", type=int, nargs="+", default=[32])
    parser.add_argument("--warps", type=int, nargs="+", default=[DECODE_WARPS])
    parser.add_argument("--spread", action="store_true", help="contexts spread around --context")
    parser.add_argument("--splits", type=int, nargs="+", help="splits to time (default: chosen)")
    parser.add_argument("--pages", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--variants", nargs="+", help="builds WARPS:STAGES:TILE:ORDER to time")
    parser.add_argument(
        "--tables", nargs="+", choices=["scattered", "ordered"], default=["scattered"]
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        help="the length the splits are chosen for, as the engine's graphs choose them (W4: 4096)",
    )
    args = parser.parse_args()
    variants = [parse_build(v) for v in args.variants or []] or [
        DecodeBuild(warps=warps) for warps in args.warps
    ]
    copy_bw = _copy_bytes_per_s()
    heads_kv, head_dim = 8, 128
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for heads, context, num_seqs in itertools.product(args.heads, args.context, args.seqs):
        q = torch.randn(num_seqs, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        lens = contexts(num_seqs, context, args.spread).cuda()
        longest = int(lens.max())
        kv_bytes = 2 * int(lens.sum()) * heads_kv * head_dim * 2
        for block_size, tables_kind in itertools.product(args.pages, args.tables):
            scattered = tables_kind == "scattered"
            k, v, tables = cache(num_seqs, longest, block_size, heads_kv, head_dim, scattered)
            chosen = choose_num_splits(num_seqs, heads_kv, max(longest, args.max_model_len), sms)
            candidates = [
                (
                    f"ours: {describe(build)}, {splits} splits",
                    ours(q, k, v, tables, lens, splits, build),
                )
                for build in variants
                for splits in (args.splits or [chosen])
            ]
            if block_size == 64 and scattered:
                try:
                    candidates.append(
                        ("xformers triton_splitk", xformers(q, k, v, tables, lens, block_size))
                    )
                except ImportError:
                    pass
            for name, fn in candidates:
                try:
                    seconds = graph_seconds(fn)
                except RuntimeError as error:  # a kernel that cannot be captured
                    print(f"{name}: not timed, its capture failed: {error}")
                    continue
                rows.append(
                    [
                        f"{heads}/{heads_kv}",
                        f"{context} (mean, spread)" if args.spread else str(context),
                        str(num_seqs),
                        f"{block_size}, {tables_kind}",
                        name,
                        f"{seconds * 1e3:.3f}",
                        f"{kv_bytes / seconds / copy_bw:.0%}",
                    ]
                )
            del k, v, tables
    print(
        f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; head dim {head_dim}; splits chosen for "
        f"{args.max_model_len} tokens; each kernel timed in a CUDA graph, replayed"
    )
    headers = ["q/kv heads", "context", "seqs", "page, blocks", "kernel", "ms", "KV read / copy bw"]
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
