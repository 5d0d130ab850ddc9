"""Paged decode attention alone, on the GPU: our Triton kernel against xformers' triton_splitk,
in KV bytes read per second beside the measured copy bandwidth (the floor).

    python tools/bench_decode_kernel.py [--seqs 64] [--context 4096]
"""

from __future__ import annotations

import argparse

import torch

from aioworker.bench.gpu import _copy_bytes_per_s, _time_cuda
from aioworker.bench.report import format_table
from aioworker.compute.layers.attention.triton_decode import choose_num_splits, paged_decode


def cache(num_seqs: int, context: int, block_size: int, heads_kv: int, head_dim: int):
    blocks_per_seq = -(-context // block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, heads_kv, head_dim)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(num_blocks, device="cuda").view(num_seqs, blocks_per_seq).int()
    return k, v, tables


def ours(q, k, v, tables, lens, splits):
    return lambda: paged_decode(q, k, v, tables, lens, q.shape[-1] ** -0.5, splits)


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
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args()
    copy_bw = _copy_bytes_per_s()
    heads, heads_kv, head_dim = 32, 8, 128
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for num_seqs in args.seqs:
        q = torch.randn(num_seqs, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((num_seqs,), args.context, device="cuda", dtype=torch.int32)
        kv_bytes = 2 * num_seqs * args.context * heads_kv * head_dim * 2
        for block_size in (16, 64):
            k, v, tables = cache(num_seqs, args.context, block_size, heads_kv, head_dim)
            splits = choose_num_splits(num_seqs, heads_kv, args.context, sms)
            candidates = [("triton (ours)", ours(q, k, v, tables, lens, splits))]
            if block_size == 64:
                try:
                    candidates.append(
                        ("xformers triton_splitk", xformers(q, k, v, tables, lens, block_size))
                    )
                except ImportError:
                    pass
            for name, fn in candidates:
                seconds = _time_cuda(fn, 50)
                rows.append(
                    [
                        str(num_seqs),
                        str(block_size),
                        name,
                        f"{seconds * 1e3:.3f}",
                        f"{kv_bytes / seconds / copy_bw:.0%}",
                    ]
                )
            del k, v, tables
    print(
        f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; context {args.context}; 32 q / 8 kv heads x 128"
    )
    print(format_table(["seqs", "page", "kernel", "ms", "KV read / copy bw"], rows))


if __name__ == "__main__":
    main()
