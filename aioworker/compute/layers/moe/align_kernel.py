"""align.py's grouping in one Triton kernel: a decode step passes through every MoE layer, and
align.py's two dozen small torch kernels cost more there than the experts' weights take to read
(measured on the H200, docs/benchmarks.md). Program e of E counts every expert's choices
(tl.histogram), finds where expert e's padded run starts, and writes its run: its choices in
token order, its padding rows, its blocks' expert id; it adds its count to the rank's expert
load counters too (load_meter.py), which would otherwise cost kernels of their own."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioworker.compute.layers.moe.align import max_padded_rows

CHUNK = 1024


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, num_blocks_ptr, counts_ptr,
    num_choices, num_experts,
    BLOCK_M: tl.constexpr, BINS: tl.constexpr, CHUNK: tl.constexpr, COUNT: tl.constexpr,
):  # fmt: skip
    expert = tl.program_id(0)
    offsets = tl.arange(0, CHUNK)
    bins = tl.arange(0, BINS)
    counts = tl.zeros((BINS,), dtype=tl.int32)
    for start in range(0, num_choices, CHUNK):
        ids = tl.load(ids_ptr + start + offsets, mask=start + offsets < num_choices, other=-1)
        # dropped choices (-1) and the chunk's tail go to the spare bin past the experts
        ids = tl.where(ids < 0, num_experts, ids)
        counts += tl.histogram(ids, BINS)
    padded = tl.where(bins < num_experts, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    run_start = tl.sum(tl.where(bins < expert, padded, 0), axis=0)
    count = tl.sum(tl.where(bins == expert, counts, 0), axis=0)
    run_rows = tl.sum(tl.where(bins == expert, padded, 0), axis=0)
    if expert == 0:
        tl.store(num_blocks_ptr, tl.sum(padded, axis=0) // BLOCK_M)
    if COUNT:
        tl.store(counts_ptr + expert, tl.load(counts_ptr + expert) + count.to(tl.int64))
    written = 0
    for start in range(0, num_choices, CHUNK):
        choices = start + offsets
        ids = tl.load(ids_ptr + choices, mask=choices < num_choices, other=-1)
        mine = (ids == expert).to(tl.int32)
        rows = run_start + written + tl.cumsum(mine, axis=0) - 1
        tl.store(sorted_ptr + rows, choices, mask=mine == 1)
        written += tl.sum(mine, axis=0)
    for row in range(count, run_rows, BLOCK_M):  # the run's padding, under one block
        pad = row + tl.arange(0, BLOCK_M)
        tl.store(sorted_ptr + run_start + pad, num_choices, mask=pad < run_rows)
    for block in range(run_start // BLOCK_M, (run_start + run_rows) // BLOCK_M):
        tl.store(block_expert_ptr + block, expert)


def align_by_expert_fused(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, counts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """align.align_by_expert's result (rows and blocks past the used ones are left unwritten:
    the kernels that read them stop at num_valid_blocks); adds each expert's choices to
    `counts` [E] int64 where given."""
    flat_ids = topk_ids.reshape(-1).to(torch.int32)
    num_choices = flat_ids.numel()
    num_rows = max_padded_rows(num_choices, num_experts, block_m)
    device = flat_ids.device
    sorted_choice_ids = torch.empty(num_rows, dtype=torch.int32, device=device)
    block_expert_ids = torch.empty(num_rows // block_m, dtype=torch.int32, device=device)
    num_valid_blocks = torch.empty(1, dtype=torch.int32, device=device)
    _align_kernel[(num_experts,)](
        flat_ids, sorted_choice_ids, block_expert_ids, num_valid_blocks,
        counts if counts is not None else num_valid_blocks,
        num_choices, num_experts,
        BLOCK_M=block_m, BINS=triton.next_power_of_2(num_experts + 1), CHUNK=CHUNK,
        COUNT=counts is not None,
    )  # fmt: skip
    return sorted_choice_ids, block_expert_ids, num_valid_blocks
