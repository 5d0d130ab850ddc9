"""The routed choices grouped by expert for the fused kernel (triton_experts.py): each expert's
choices padded to whole blocks of `block_m` rows, so that one program's block holds one expert.

All on the device with sizes fixed by the shapes alone (no host synchronisation), so that a CUDA
graph can capture it: the used blocks are counted in a device tensor that the kernels read.
"""

from __future__ import annotations

import torch


def max_padded_rows(num_choices: int, num_experts: int, block_m: int) -> int:
    """The rows the grouped choices can need: each expert that has choices pads fewer than
    block_m rows, and at most min(experts, choices) of them have any."""
    bound = num_choices + min(num_experts, num_choices) * (block_m - 1)
    return -(-bound // block_m) * block_m


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] (-1: computed on another rank) -> (sorted_choice_ids, block_expert_ids,
    num_valid_blocks), all int32 on topk_ids' device:

    - sorted_choice_ids [max_padded_rows]: flat choice ids t * K + k, each expert's run
      starting on a block boundary; padding rows and rows past the used blocks hold T * K;
    - block_expert_ids [max_padded_rows / block_m]: the expert of each block (num_experts past
      the used blocks);
    - num_valid_blocks [1]: how many blocks are used.
    """
    flat_ids = topk_ids.reshape(-1)
    num_choices = flat_ids.numel()
    num_rows = max_padded_rows(num_choices, num_experts, block_m)
    device = flat_ids.device
    # Dropped choices go to an extra bucket past the last expert: sorted last, never placed.
    experts = torch.where(flat_ids >= 0, flat_ids.long(), num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)  # [E]
    padded_start = torch.cat([padded_end - padded, padded_end.new_zeros(1)])  # [E + 1]
    count_start = counts.cumsum(0) - counts  # [E + 1]

    # Stable, so that each expert's rows keep their token order (and runs repeat exactly).
    sorted_experts, order = torch.sort(experts, stable=True)
    rank = torch.arange(num_choices, device=device) - count_start[sorted_experts]
    rows = padded_start[sorted_experts] + rank
    rows = torch.where(sorted_experts < num_experts, rows, num_rows)  # dropped: a spare last row
    sorted_choice_ids = torch.full((num_rows + 1,), num_choices, dtype=torch.int32, device=device)
    sorted_choice_ids.scatter_(0, rows, order.to(torch.int32))

    block_starts = torch.arange(0, num_rows, block_m, device=device)
    block_expert_ids = torch.searchsorted(padded_end, block_starts, right=True, out_int32=True)
    num_valid_blocks = (padded_end[-1:] // block_m).to(torch.int32)
    return sorted_choice_ids[:num_rows], block_expert_ids, num_valid_blocks
