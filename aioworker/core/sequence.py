"""A request's state inside the scheduler: its tokens, how many are in the KV cache, its blocks."""

from __future__ import annotations

import enum

from aioworker.core.outputs import FinishReason
from aioworker.core.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    __slots__ = (
        "seq_id",
        "request_id",
        "token_ids",
        "num_prompt_tokens",
        "num_computed_tokens",
        "block_table",
        "params",
        "status",
        "finish_reason",
        "stop_token_ids",
        "num_pending_tokens",
        "num_stale_tokens",
    )

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.params = params
        self.status = SeqStatus.WAITING
        self.finish_reason: FinishReason | None = None
        eos = () if params.ignore_eos else eos_token_ids
        self.stop_token_ids = frozenset(params.stop_token_ids) | frozenset(eos)
        # Sampled by a step in flight, not yet appended to token_ids (scheduling runs ahead).
        self.num_pending_tokens = 0
        # In-flight tokens from before a preemption: they arrive, and are dropped.
        self.num_stale_tokens = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) + self.num_pending_tokens - self.num_computed_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request_id!r}, len={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table}, {self.status.value})"
        )
