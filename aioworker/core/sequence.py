"""A request's state inside the scheduler: its tokens, how many are in the KV cache, its blocks."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from aioworker.core.outputs import FinishReason, TokenLogprobs
from aioworker.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from aioworker.core.grammar import SequenceGrammar


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    # Not scheduled yet: its blocks are being filled, or were, from another tier
    # (core/kv_connector.py).
    LOADING = "loading"
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
        "prompt_logprobs",
        "block_hashes",
        "cache_epoch",
        "num_cached_tokens",
        "sample_index",
        "followers",
        "leader",
        "num_draft_tokens",
        "can_speculate",
        "next_drafts",
        "num_proposed_tokens",
        "num_accepted_tokens",
        "grammar",
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
        # A guided output ends where its grammar does, with a stop token: EOS stays one.
        eos = () if params.ignore_eos and params.guided is None else eos_token_ids
        self.stop_token_ids = frozenset(params.stop_token_ids) | frozenset(eos)
        # Sampled by a step in flight, not yet appended to token_ids (scheduling runs ahead).
        self.num_pending_tokens = 0
        # In-flight tokens from before a preemption: they arrive, and are dropped.
        self.num_stale_tokens = 0
        # Where asked for: one per prompt token after the first, as steps score them.
        self.prompt_logprobs: list[TokenLogprobs] | None = (
            [] if params.prompt_logprobs is not None else None
        )
        # Prefix caching: the content address of each full block so far, and the cache epoch
        # its KV began in (-1: not shared); the tokens it found computed when admitted.
        self.block_hashes: list[bytes] = []
        self.cache_epoch = -1
        self.num_cached_tokens = 0
        # Parallel samples: sample 0 leads; the others wait in `followers` until its prompt is
        # computed, then start from its cached blocks (`leader` points back).
        self.sample_index = 0
        self.followers: list[Sequence] | None = None
        self.leader: Sequence | None = None
        # Speculative decoding: drafts in the step in flight (its token count is 1 + these);
        # whether drafts may be proposed at all (not where logit controls need every token's
        # own step); drafts proposed and accepted so far.
        self.num_draft_tokens = 0
        self.can_speculate = True
        # Drafts the executor proposed after the sequence's last step (a draft model), for its
        # next one; emptied when used or when they no longer follow its tokens.
        self.next_drafts: list[int] = []
        self.num_proposed_tokens = 0
        self.num_accepted_tokens = 0
        # Guided decoding: the matcher of the request's grammar (core/grammar.py), else None.
        self.grammar: SequenceGrammar | None = None

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
    def needs_prompt_logprobs(self) -> bool:
        """Asked for, and not all computed yet (a preemption recomputes only what is missing)."""
        return (
            self.prompt_logprobs is not None
            and len(self.prompt_logprobs) < self.num_prompt_tokens - 1
        )

    def add_prompt_logprobs(self, first_position: int, entries: list[TokenLogprobs]) -> None:
        """Keep the entries for positions not scored yet (position i: prompt token i)."""
        have = len(self.prompt_logprobs) + 1  # the next position wanted
        skip = have - first_position
        if 0 <= skip < len(entries):
            self.prompt_logprobs.extend(entries[skip:])

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request_id!r}, len={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table}, {self.status.value})"
        )
