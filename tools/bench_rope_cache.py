"""The rotary-and-cache kernel (`fused.qkv_rope_cache_`) at tokens a program of 1 (the decode
graphs' launch) against more, for a model's heads at several step sizes: each launch timed in a
CUDA graph of 20, the sides alternating, three rounds, medians; and how many bf16 elements of q,
k and the cache differ from one token a program's (the q/k norm sums in another order).

    python tools/bench_rope_cache.py [--model qwen3-0.6b] [--rows 4 16] [--tokens 64 256 ...]
    TRITON_INTERPRET=1 python tools/bench_rope_cache.py --check   # on the CPU: the sides agree

Why: the kernel took 295 us a layer in a 15,680-token prefill on an H100 at one token a program
(docs/benchmarks.md, 2026-12-07). This tool's tables chose `fused.ROWS` (4) from
`fused.ROWS_FROM_TOKENS` (64): the fastest, or close to it, at every step size from 64 tokens.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_decode_kernel import graph_seconds  # tools/, beside this script

from aioworker.bench.gpu import MODELS
from aioworker.checkpoint.model_config import load_model_config
from aioworker.compute.layers import fused

GRAPH_LAUNCHES = 20


def make_inputs(tokens: int, q_heads: int, kv_heads: int, head_dim: int, norm: bool, device):
    """One step's qkv rows, rotary tables, norms, caches and distinct slots, the same each call."""
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, device=device, dtype=dt, generator=g)

    qkv = rand(tokens, (q_heads + 2 * kv_heads) * head_dim)
    cos, sin = rand(tokens, head_dim, dt=torch.float32), rand(tokens, head_dim, dt=torch.float32)
    norms = (rand(head_dim), rand(head_dim)) if norm else (None, None)
    blocks = tokens // 16 + 8
    k_cache = torch.zeros(blocks, 16, kv_heads, head_dim, device=device, dtype=dtype)
    slots = torch.randperm(blocks * 16, device=device, generator=g)[:tokens]
    return qkv, cos, sin, norms, k_cache, torch.zeros_like(k_cache), slots


def launch(inputs, q_heads: int, kv_heads: int, head_dim: int, rows: int) -> None:
    qkv, cos, sin, (q_norm, k_norm), k_cache, v_cache, slots = inputs
    sizes = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    q, k, v = (t.view(qkv.shape[0], -1, head_dim) for t in qkv.split(sizes, dim=-1))
    fused.qkv_rope_cache_(q, k, v, cos, sin, q_norm, k_norm, 1e-6, k_cache, v_cache, slots, rows)


def graph_us(inputs, shape, rows: int) -> float:
    """Microseconds a launch, GRAPH_LAUNCHES of them in one graph (inputs rotate each time,
    which changes no launch's work)."""

    def launches() -> None:
        for _ in range(GRAPH_LAUNCHES):
            launch(inputs, *shape, rows)

    return graph_seconds(launches) * 1e6 / GRAPH_LAUNCHES


def differing(tokens, shape, norm, device, rows: int) -> int:
    """Elements of q, k and the two caches that differ from one token a program's, one launch."""
    base, other = (make_inputs(tokens, *shape, norm, device) for _ in range(2))
    launch(base, *shape, 1)
    launch(other, *shape, rows)
    pairs = [(base[0], other[0]), (base[4], other[4]), (base[5], other[5])]
    return sum(int((a != b).sum()) for a, b in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 512, 1024, 4096, 15680])
    parser.add_argument("--check", action="store_true", help="on the CPU: no timing, agreement")
    args = parser.parse_args()
    config = load_model_config(MODELS / args.model)
    shape = (config.num_attention_heads, config.num_key_value_heads, config.head_dim)
    norm = config.qk_norm
    device = torch.device("cpu" if args.check else "cuda")
    tokens_list = [17, 40] if args.check else args.tokens
    print(f"{args.model}: {shape[0]} query and {shape[1]} KV heads of {shape[2]}, q/k norm {norm}")
    header = " | ".join(f"{r} rows, us | elements differing" for r in args.rows)
    print(f"| tokens | 1 row, us | {header} |")
    print("| --- " * (2 + 2 * len(args.rows)) + "|")
    for tokens in tokens_list:
        diffs = [differing(tokens, shape, norm, device, r) for r in args.rows]
        if args.check:
            print(f"| {tokens} | - | " + " | ".join(f"- | {d}" for d in diffs) + " |")
            continue
        times = {r: [] for r in [1, *args.rows]}
        for _ in range(3):
            for r in times:
                times[r].append(graph_us(make_inputs(tokens, *shape, norm, device), shape, r))
        cells = [
            f"{statistics.median(times[r]):.1f} | {d}"
            for r, d in zip(args.rows, diffs, strict=True)
        ]
        print(f"| {tokens} | {statistics.median(times[1]):.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
