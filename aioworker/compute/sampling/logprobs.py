"""Logprobs on the device: of each sampled token and of prompt tokens, with the top-k
alternatives, computed in the step that samples and copied to the host with its tokens.

Both are taken under the distribution a token is sampled from: the logits divided by the
request's temperature (1 for greedy requests), after min_tokens masking and the logit controls'
masks, biases and penalties, before the min_p, top-k and top-p truncations. Prompt tokens are
scored the same way, without the masking and the controls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aioworker.compute.small_copies import pinned_copy
from aioworker.core.outputs import TokenLogprobs
from aioworker.core.plan import PromptLogprobs, StepPlan, StepResult


@dataclass(slots=True)
class LogprobTensors:
    """Per row: the logprob of its token, and the k most likely tokens with theirs."""

    chosen: torch.Tensor  # [R] float32
    top_ids: torch.Tensor  # [R, k] int64
    top_values: torch.Tensor  # [R, k] float32

    def to_host(self) -> LogprobTensors:
        """Queue the copy to pinned host memory (no wait); on the CPU, the tensors themselves."""
        if self.chosen.device.type != "cuda":
            return self
        return LogprobTensors(
            *(pinned_copy(t) for t in (self.chosen, self.top_ids, self.top_values))
        )


def token_logprobs(scaled: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobTensors:
    """scaled [R, V]: float32 logits already divided by each row's temperature; token_ids [R].
    log_softmax(x) = x - logsumexp(x), and the top k of `scaled` are those of its log-softmax:
    so no [R, V] log-softmax is ever written. On the GPU one Triton pass finds both."""
    if scaled.is_cuda:
        from aioworker.compute.sampling.logprob_kernel import lse_and_top_k

        normaliser, top_values, top_ids = lse_and_top_k(scaled.contiguous(), k)
    else:
        normaliser = torch.logsumexp(scaled, dim=-1)
        top_values, top_ids = scaled.topk(k, dim=-1)
    chosen = scaled.gather(1, token_ids.long()[:, None]).squeeze(1) - normaliser
    return LogprobTensors(chosen, top_ids.long(), top_values - normaliser[:, None])


def scale(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """float32 logits / temperature per row (temperatures [R]: 1 where a request is greedy)."""
    return logits.float() / temperatures[:, None]


@dataclass(slots=True)
class PromptSpan:
    """The prompt positions of one sequence scored in this step: batch rows first_row.. score
    the tokens at first_position.. (each row predicts the next prompt token)."""

    seq_id: int
    first_row: int
    first_position: int
    targets: list[int]
    k: int
    temperature: float


def prompt_spans(plan: StepPlan, seqs: dict) -> list[PromptSpan]:
    """What this step's prompt chunks score, for sequences that asked for prompt logprobs.
    `seqs`: the runner's per-sequence state (prompt ids and sampling settings)."""
    spans, offset = [], 0
    for seq_id, num_tokens, start in zip(
        plan.seq_ids, plan.num_scheduled_tokens, plan.start_positions, strict=True
    ):
        state = seqs[seq_id]
        k = state.sampling.prompt_logprobs
        end = min(start + num_tokens, state.num_prompt_tokens - 1)
        if k >= 0 and end > start:
            targets = state.token_ids[start + 1 : end + 1]
            temperature = state.sampling.temperature or 1.0
            spans.append(PromptSpan(seq_id, offset, start + 1, targets, k, temperature))
        offset += num_tokens
    return spans


# Prompt rows scored per pass: a pass holds [rows, vocabulary] float32 logits twice (logits and
# their log-softmax), as many as the sampler holds for max_num_seqs rows.
PROMPT_ROWS_PER_PASS = 256


def score_prompts(
    hidden: torch.Tensor, spans: list[PromptSpan], compute_logits, is_driver: bool
) -> LogprobTensors | None:
    """The prompt logprobs of `spans`, from the step's final hidden states, in passes of at most
    PROMPT_ROWS_PER_PASS rows so a long prompt chunk never holds all its logits at once.
    `compute_logits` is a collective under tensor parallelism: every rank makes the same calls,
    and only the driver keeps the result."""
    device = hidden.device
    rows = torch.tensor([s.first_row + i for s in spans for i in range(len(s.targets))])
    temperatures = torch.tensor([s.temperature for s in spans for _ in s.targets])
    targets = torch.tensor([t for s in spans for t in s.targets])
    k = max(s.k for s in spans)
    parts = []
    for start in range(0, len(rows), PROMPT_ROWS_PER_PASS):
        piece = slice(start, start + PROMPT_ROWS_PER_PASS)
        logits = compute_logits(hidden[rows[piece].to(device)])
        if is_driver:
            scaled = scale(logits, temperatures[piece].to(device))
            parts.append(token_logprobs(scaled, targets[piece].to(device), k))
    if not is_driver:
        return None
    return LogprobTensors(
        *(torch.cat(tensors) for tensors in zip(*map(_fields, parts), strict=True))
    )


def _fields(tensors: LogprobTensors) -> tuple[torch.Tensor, ...]:
    return tensors.chosen, tensors.top_ids, tensors.top_values


@dataclass(slots=True)
class StepLogprobs:
    """What a step computed beyond its tokens: filled on the device, read on the host."""

    token_ks: list[int]  # per sampled row; -1 where it asked for no logprobs
    tokens: LogprobTensors | None = None
    spans: list[PromptSpan] | None = None
    prompt: LogprobTensors | None = None

    def to_host(self) -> StepLogprobs:
        return StepLogprobs(
            self.token_ks,
            self.tokens.to_host() if self.tokens is not None else None,
            self.spans,
            self.prompt.to_host() if self.prompt is not None else None,
        )

    def result(
        self,
        step_id: int,
        token_ids: list[int],
        num_sampled: list[int] | None = None,
        rows: list[int] | None = None,
    ) -> StepResult:
        """The StepResult, once the host copies are complete. `rows`: the sampled rows that
        `token_ids` come from, where a step verified drafts (`num_sampled` per sequence)."""
        logprobs = None
        if self.tokens is not None:
            rows = range(len(token_ids)) if rows is None else rows
            logprobs = _entries(self.tokens, token_ids, self.token_ks, rows)
        prompt = []
        if self.prompt is not None:
            prompt = _prompt_entries(self.prompt, self.spans)
        return StepResult(step_id, token_ids, logprobs, prompt, num_sampled)


def _entries(
    host: LogprobTensors, token_ids: list[int], ks: list[int], rows
) -> list[TokenLogprobs | None]:
    chosen, top_ids, top_values = (
        host.chosen.tolist(),
        host.top_ids.tolist(),
        host.top_values.tolist(),
    )
    entries = []
    for token, i in zip(token_ids, rows, strict=True):
        k = ks[i]
        entries.append(
            TokenLogprobs(token, chosen[i], tuple(top_ids[i][:k]), tuple(top_values[i][:k]))
            if k >= 0
            else None
        )
    return entries


def _prompt_entries(host: LogprobTensors, spans: list[PromptSpan]) -> list[PromptLogprobs]:
    chosen, top_ids, top_values = (
        host.chosen.tolist(),
        host.top_ids.tolist(),
        host.top_values.tolist(),
    )
    results, row = [], 0
    for span in spans:
        entries = []
        for token in span.targets:
            k = span.k
            entries.append(
                TokenLogprobs(
                    token, chosen[row], tuple(top_ids[row][:k]), tuple(top_values[row][:k])
                )
            )
            row += 1
        results.append(PromptLogprobs(span.seq_id, span.first_position, entries))
    return results
