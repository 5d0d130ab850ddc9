"""Experts split across a group's ranks: each token travels to the ranks that hold its experts
and its results travel back, by two all_to_all exchanges (NCCL on GPU, gloo on CPU).

Every rank holds every token after attention (attention stays tensor-parallel), so the tokens
are shared out first: rank r routes and sends the r-th of `size` equal slices. The exchange
has static shapes, with no host synchronisation, so it runs inside CUDA graphs: each rank sends
every rank a row per token of its slice (zeros, and ids of -1, where that rank holds none of the
token's experts), with the token's routing restricted to the receiver's experts. The receiver
multiplies what it got by its experts, weights applied, and sends each row back; the sender
sums the rows from every rank. A rank's result holds its own slice's tokens and zeros elsewhere:
the MoE block's one all-reduce, which it needs for the shared experts anyway, joins the slices.

The price of static shapes is bandwidth: each rank sends size x its slice's rows, about T x D
per exchange, where a variable-size exchange would send only the rows routed elsewhere. With
data-parallel attention (a later issue) each rank's tokens differ, and this exchange is the
one that carries them.
"""

from __future__ import annotations

import torch

from aioworker.compute.layers.moe.experts import FusedExperts


def through_owners(
    experts: FusedExperts, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """x: [T, D], topk_ids/weights: [T, K] (global expert ids) -> [T, D]: this rank's slice of
    tokens through their experts, zeros elsewhere."""
    tp, layout = experts.tp, experts.layout
    num_tokens = x.shape[0]
    per_rank = -(-num_tokens // tp.size)
    first = min(tp.rank * per_rank, num_tokens)
    last = min(first + per_rank, num_tokens)
    mine = slice(first, last)
    x_mine = _padded(x[mine], per_rank, 0.0)  # [P, D]
    ids_mine = _padded(topk_ids[mine].long(), per_rank, -1)  # [P, K]
    weights_mine = _padded(topk_weights[mine], per_rank, 0.0)
    # Each rank's share of the experts (contiguous, as TensorParallel.partition splits them).
    starts = _expert_starts(layout.num_experts, tp.size, x.device)
    owner = torch.bucketize(ids_mine, starts, right=True) - 1  # [P, K]; -1 ids stay -1
    ranks = torch.arange(tp.size, device=x.device).view(-1, 1, 1)
    is_owned = (owner.unsqueeze(0) == ranks) & (ids_mine.unsqueeze(0) >= 0)  # [N, P, K]
    local_ids = torch.where(is_owned, ids_mine.unsqueeze(0) - starts.view(-1, 1, 1), -1)
    send_x = torch.where(is_owned.any(-1, keepdim=True), x_mine.unsqueeze(0), 0.0)  # [N, P, D]
    send_w = torch.where(is_owned, weights_mine.unsqueeze(0), 0.0).to(torch.float32)
    got_x, got_ids, got_w = _exchange(tp, send_x, local_ids.to(torch.int32), send_w)
    rows = got_x.reshape(-1, x.shape[1])
    products = experts.multiply(
        rows, got_ids.reshape(rows.shape[0], -1), got_w.reshape(rows.shape[0], -1)
    )
    returned = tp.all_to_all(products.reshape(send_x.shape))  # [N, P, D]: from each owner
    out = torch.zeros_like(x)
    out[mine] = returned.sum(0, dtype=torch.float32).to(x.dtype)[: last - first]
    return out


def _exchange(
    tp, rows: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One all_to_all for the rows, their ids and their weights: the int32 ids and float32
    weights ride as raw bits in extra columns of the rows' dtype: at decode sizes a
    collective's latency, not its bytes, is what a step pays (docs/benchmarks.md, ep)."""
    width = rows.shape[-1]
    packed = torch.cat([rows, ids.view(rows.dtype), weights.view(rows.dtype)], dim=-1)
    got = tp.all_to_all(packed)
    num_id_columns = ids.view(rows.dtype).shape[-1]
    got_ids = got[..., width : width + num_id_columns].contiguous().view(torch.int32)
    got_weights = got[..., width + num_id_columns :].contiguous().view(torch.float32)
    return got[..., :width], got_ids, got_weights


def _padded(rows: torch.Tensor, length: int, value: float) -> torch.Tensor:
    missing = length - rows.shape[0]
    if missing == 0:
        return rows
    pad = torch.full((missing, *rows.shape[1:]), value, dtype=rows.dtype, device=rows.device)
    return torch.cat([rows, pad])


def _expert_starts(num_experts: int, size: int, device: torch.device) -> torch.Tensor:
    """The first expert of each rank's share."""
    base, extra = divmod(num_experts, size)
    return torch.tensor([r * base + min(r, extra) for r in range(size)], device=device)
