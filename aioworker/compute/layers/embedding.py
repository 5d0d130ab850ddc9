"""Token embedding and LM head with the vocabulary split across tensor-parallel ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.compute.layers.linear_method import UNQUANTIZED, LinearMethod
from aioworker.compute.parallel import TensorParallel


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        # Pad so every rank holds the same number of rows; padded rows are never looked up.
        self.rows_per_rank = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * self.rows_per_rank
        self.weight = nn.Parameter(
            torch.empty(self.rows_per_rank, hidden_size), requires_grad=False
        )
        self.weight.weight_loader = self.load_weight

    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, name: str) -> None:
        expected = (self.vocab_size, param.shape[1])
        if tuple(loaded.shape) != expected:
            raise ValueError(
                f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {expected}"
            )
        rows = max(0, min(self.rows_per_rank, self.vocab_size - self.vocab_start))
        param.data[:rows].copy_(loaded.narrow(0, self.vocab_start, rows))
        param.data[rows:].zero_()

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows_per_rank)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x = x.masked_fill(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(x)


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> logits over the full vocabulary (each rank computes its slice, then
    gather). Its weight is an embedding's (it may be tied to the input embedding), so its
    method only multiplies: it must be one that keeps the dense weight."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tp: TensorParallel,
        linear_method: LinearMethod = UNQUANTIZED,
    ) -> None:
        super().__init__(vocab_size, hidden_size, tp)
        self.linear_method = linear_method

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [S, D] -> logits: [S, V]
        logits = self.linear_method.apply(self, hidden)
        return self.tp.gather_last_dim(logits)[:, : self.vocab_size]
