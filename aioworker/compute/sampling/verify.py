"""Verification of draft tokens: one step computed every drafted position, and this decides, per
sequence, how many drafts to keep and the one token that follows them.

Each sequence with k drafts has k + 1 rows of logits: row j is the target's distribution for
the position of draft j (row k: the position after the last draft). Rows are walked in order
and the first rejection ends a sequence's run:
- greedy rows keep draft j where it is the argmax of row j; the token after the kept drafts is
  that row's argmax, so the output is exactly what decoding one token at a time gives;
- sampled rows use rejection sampling (Leviathan et al. 2023; Chen et al. 2023) with a draft
  distribution q that puts all its mass on the draft (n-gram drafts are guesses, not draws):
  draft j is kept with probability p_j(draft), and on rejection the token is drawn from p_j
  with the draft removed and the rest renormalised, which is (p - q)+ normalised. Then every
  token is distributed exactly as the target's p, whatever the drafts were. p is the
  distribution the sampler draws from: after the logit controls, temperature, min_p, top-k
  and top-p.
Seeded rows take their acceptance draws and their noise from (seed, position), so a seeded
request reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aioworker.compute.sampling.controls import StepControls
from aioworker.compute.sampling.logprobs import LogprobTensors, token_logprobs
from aioworker.compute.sampling.sampler import Sampler, SampleRow
from aioworker.compute.small_copies import to_device


@dataclass(slots=True)
class DraftRows:
    """A step's sampled rows where some sequences have drafts."""

    draft_ids: list[int]  # per row: the draft at that row's position, -1 where none
    rows_per_seq: list[int]  # per sampled sequence: its rows (its drafts + 1)

    def emitted_rows(self, num_sampled: list[int]) -> list[int]:
        """The rows whose tokens a sequence keeps: the first num_sampled[i] of sequence i's."""
        kept, first = [], 0
        for num_rows, count in zip(self.rows_per_seq, num_sampled, strict=True):
            kept.extend(range(first, first + count))
            first += num_rows
        return kept


def verify(
    sampler: Sampler,
    logits: torch.Tensor,
    rows: list[SampleRow],
    drafts: DraftRows,
    controls: StepControls | None,
) -> tuple[torch.Tensor, torch.Tensor, LogprobTensors | None]:
    """logits [R, V] from the logits stage -> (each row's token [R], tokens kept per sequence
    [S], the rows' logprobs where any row asked)."""
    device = logits.device
    logits = logits.float()
    if controls is not None:
        controls.process_logits(logits)
    draft_ids = to_device(device, drafts.draft_ids)
    has_draft = draft_ids >= 0
    draft = draft_ids.clamp_min(0)
    target = logits.argmax(dim=-1)
    is_greedy = [row.sampling.temperature == 0.0 for row in rows]
    scaled = logits
    if all(is_greedy):
        tokens, accepted = target, has_draft & (target == draft)
    else:
        temperatures = [row.sampling.temperature or 1.0 for row in rows]
        if any(t != 1.0 for t in temperatures):
            scaled = logits / to_device(device, temperatures)[:, None]
        tokens, accepted = _rejection_sample(sampler, scaled, rows, controls, draft, has_draft)
        if any(is_greedy):
            greedy = to_device(device, is_greedy)
            tokens = torch.where(greedy, target, tokens)
            accepted = torch.where(greedy, has_draft & (target == draft), accepted)
    if controls is not None:
        controls.record(tokens)
    counts = _kept_per_seq(accepted, drafts.rows_per_seq)
    k = max(row.sampling.logprobs for row in rows)
    return tokens, counts, (token_logprobs(scaled, tokens, k) if k >= 0 else None)


def _rejection_sample(sampler, scaled, rows, controls, draft, has_draft):
    truncated = sampler.truncate(scaled, rows, controls)
    probs = torch.softmax(truncated, dim=-1)
    draft_prob = probs.gather(1, draft[:, None]).squeeze(1)
    uniforms = to_device(scaled.device, sampler.uniforms(rows), torch.float32)
    accepted = has_draft & (uniforms < draft_prob)
    # The residual (p - q)+: the draft's own logit removed where a row has a draft.
    removed = torch.where(has_draft, draft, truncated.shape[-1])
    residual = torch.cat([truncated, truncated.new_zeros(len(rows), 1)], dim=-1)
    residual.scatter_(1, removed[:, None], float("-inf"))
    drawn = sampler.draw(residual[:, :-1].contiguous(), rows)
    return torch.where(accepted, draft, drawn), accepted


def _kept_per_seq(accepted: torch.Tensor, rows_per_seq: list[int]) -> torch.Tensor:
    """Per sequence: its leading accepted drafts, plus one."""
    longest = max(rows_per_seq)
    index, first = [], 0
    padding = len(accepted)  # points at an appended False
    for num_rows in rows_per_seq:
        drafts = list(range(first, first + num_rows - 1))
        index.append(drafts + [padding] * (longest - len(drafts)))
        first += num_rows
    padded = torch.cat([accepted, accepted.new_zeros(1)])
    table = padded[to_device(accepted.device, index).view(len(rows_per_seq), longest)]
    return table.long().cumprod(dim=1).sum(dim=1) + 1
