"""One step pipeline for every runner: apply the plan's state -> prepare -> forward -> logits ->
sample and share -> record -> a handle on the result.

`ModelRunner.launch` is that template, written once. A runner overrides only `prepare` (the
plan as tensors its forward reads), `forward` (eager or a captured graph), `record` (where the
next plan's PENDING_TOKEN inputs are read from) and `complete` (the handle): this CPU runner
finishes the step inside launch and returns a completed handle; the CUDA runner only queues the
step's work on the device. Keeps, per running sequence, what plans send only once: its block
table, prompt length and sampling settings (and, on the driver, the device state of its logit
controls).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from typing import Protocol

import numpy as np
import torch

from aioworker.compute.layers.attention import AttentionContext
from aioworker.compute.layers.attention.slots import SeqSlots
from aioworker.compute.parallel import TensorParallel
from aioworker.compute.sampling.controls import SamplingControls, StepControls
from aioworker.compute.sampling.logprobs import StepLogprobs, prompt_spans, score_prompts
from aioworker.compute.sampling.sampler import Sampler, SampleRow
from aioworker.core.plan import PENDING_TOKEN, SamplingSettings, StepPlan, StepResult


class PlanError(RuntimeError):
    """A plan refers to state this rank does not have: the ranks have diverged."""


@dataclass(slots=True)
class _SeqState:
    block_table: list[int]
    num_prompt_tokens: int
    sampling: SamplingSettings
    last_sampled: int = PENDING_TOKEN  # fills the next plan's PENDING_TOKEN input
    # Prompt (then outputs) where prompt logprobs or logit controls need them (NewSeq.token_ids).
    token_ids: list[int] | None = None


class StepHandle(Protocol):
    """A launched step; `result()` waits for its sampled tokens (on the executor's completion
    thread) and gives its StepResult."""

    def result(self) -> StepResult: ...


class CompletedStep:
    """A step whose result is already on the host (the CPU path runs steps synchronously)."""

    def __init__(self, result: StepResult) -> None:
        self._result = result

    def result(self) -> StepResult:
        return self._result


@dataclass
class PreparedStep:
    """What `prepare` gives the shared stages; runners add what their forward reads."""

    sample_rows: list[SampleRow]  # what each sampled row samples with
    spans: list  # prompt positions scored for prompt logprobs (logprobs.prompt_spans)
    sample_idx: torch.Tensor | None  # [S] token rows whose next token is sampled


@dataclass
class StepInputs(PreparedStep):
    """The CPU runner's prepared step."""

    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionContext


@dataclass
class Forwarded:
    """What a forward gives: every token row's final hidden state, and the sampled rows' logits
    where the forward made them itself (a captured decode graph keeps no hidden states)."""

    hidden: torch.Tensor | None
    logits: torch.Tensor | None = None


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend,
        sampler: Sampler,
        device: torch.device,
        tp: TensorParallel,
    ) -> None:
        self.model = model
        self.backend = backend
        self.sampler = sampler
        self.device = device
        self.tp = tp
        self.seqs: dict[int, _SeqState] = {}
        # Sequences that asked for prompt logprobs: steps without any skip looking for them.
        self.scoring_prompts: set[int] = set()
        # Only the driver samples, so only it keeps the controls' state.
        self.controls = SamplingControls(device, model.lm_head.vocab_size)
        self.packed = any(getattr(m, "packed_weight", None) is not None for m in model.modules())

    def drop_graphs(self) -> None:
        """Nothing to drop on the CPU; the CUDA runner frees its captured graphs."""

    def recapture_graphs(self) -> None:
        """Nothing to capture on the CPU."""

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step to its end (memory profiling, tests); the executor thread calls launch."""
        return self.launch(plan).result()

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> StepHandle:
        """The step pipeline, the same for every runner (see the module's docstring)."""
        self.apply_plan_state(plan)
        if plan.is_empty:
            return CompletedStep(StepResult(plan.step_id, []))
        step = self.prepare(plan)
        out = self.forward(plan, step)
        if not step.sample_rows and not step.spans:
            return CompletedStep(StepResult(plan.step_id, []))
        extra = StepLogprobs([row.sampling.logprobs for row in step.sample_rows])
        if step.spans:
            extra.spans = step.spans
            extra.prompt = score_prompts(
                out.hidden, step.spans, self.model.compute_logits, self.tp.is_driver
            )
        tokens = None
        if step.sample_rows:
            logits = out.logits
            if logits is None:
                logits = self.model.compute_logits(out.hidden[step.sample_idx])
            tokens = self.sample(plan, step, logits, extra)
        if not self.tp.is_driver:
            return CompletedStep(StepResult(plan.step_id, []))
        return self.complete(plan.step_id, tokens, extra)

    def sample(
        self, plan: StepPlan, step: PreparedStep, logits: torch.Tensor, extra: StepLogprobs
    ) -> torch.Tensor:
        """The driver samples; every rank gets its tokens and records them for the next plan."""
        tokens = None
        if self.tp.is_driver:
            controls = self.step_controls(plan)
            tokens, extra.tokens = self.sampler.sample(logits, step.sample_rows, controls)
        tokens = self.share_samples(tokens, len(step.sample_rows))
        self.record(plan, step, tokens)
        return tokens

    # -- what a runner overrides --------------------------------------------------------------

    def prepare(self, plan: StepPlan) -> PreparedStep:
        return self.prepare_inputs(plan)

    def forward(self, plan: StepPlan, step: StepInputs) -> Forwarded:
        return Forwarded(self.model(step.token_ids, step.positions, step.attn))

    def record(self, plan: StepPlan, step: PreparedStep, tokens: torch.Tensor) -> None:
        self.remember_samples(plan, tokens.tolist())

    def complete(
        self, step_id: int, tokens: torch.Tensor | None, extra: StepLogprobs
    ) -> StepHandle:
        token_list = tokens.tolist() if tokens is not None else []
        return CompletedStep(extra.result(step_id, token_list))

    # -- shared parts -------------------------------------------------------------------------

    def remember_samples(self, plan: StepPlan, token_ids: list[int]) -> None:
        sampled_ids = [
            s for s, do_sample in zip(plan.seq_ids, plan.sample, strict=True) if do_sample
        ]
        for seq_id, token in zip(sampled_ids, token_ids, strict=True):
            self.seqs[seq_id].last_sampled = token

    def step_controls(self, plan: StepPlan) -> StepControls | None:
        """The rows of this step's sampling that use logit controls (one check when none can)."""
        if not self.controls:
            return None
        return self.controls.for_step(compress(plan.seq_ids, plan.sample))

    def share_samples(self, tokens: torch.Tensor | None, num_rows: int) -> torch.Tensor:
        """Give every tensor-parallel rank the driver's sampled tokens: each needs them as the
        next step's inputs. On the driver `tokens` is given; peers pass None and receive."""
        if self.tp.size == 1:
            return tokens
        import torch.distributed as dist

        if tokens is None:
            tokens = torch.empty(num_rows, dtype=torch.int64, device=self.device)
        tokens = tokens.to(torch.int64)
        dist.broadcast(tokens, src=0)
        return tokens

    def resolve_pending(self, plan: StepPlan) -> list[int]:
        """The plan's input ids with each PENDING_TOKEN replaced by the token sampled for it."""
        ids = plan.input_token_ids
        if PENDING_TOKEN not in ids:
            return ids
        ids = list(ids)
        end = 0
        for seq_id, num_tokens in zip(plan.seq_ids, plan.num_scheduled_tokens, strict=True):
            end += num_tokens
            if ids[end - 1] == PENDING_TOKEN:
                ids[end - 1] = self.seqs[seq_id].last_sampled
        return ids

    def apply_plan_state(self, plan: StepPlan) -> None:
        for seq_id in plan.released_seq_ids:
            self.seqs.pop(seq_id, None)
            self.scoring_prompts.discard(seq_id)
        if self.controls:
            self.controls.release(plan.released_seq_ids)
        for new in plan.new_seqs:
            self.seqs[new.seq_id] = _SeqState(
                [], new.num_prompt_tokens, new.sampling, token_ids=new.token_ids
            )
            if new.sampling.prompt_logprobs >= 0:
                self.scoring_prompts.add(new.seq_id)
            if new.sampling.controls is not None and self.tp.is_driver:
                self.controls.admit(new)
        for seq_id, block_ids in zip(plan.seq_ids, plan.new_block_ids, strict=True):
            state = self.seqs.get(seq_id)
            if state is None:
                raise PlanError(
                    f"step {plan.step_id} schedules sequence {seq_id}, unknown to this rank"
                )
            state.block_table.extend(block_ids)

    def sample_rows(self, plan: StepPlan) -> tuple[list[int], list[SampleRow]]:
        """Batch rows whose next token is sampled, and what each one samples with."""
        sample_idx, rows = [], []
        token_offset = 0
        for seq_id, num_tokens, start, do_sample in zip(
            plan.seq_ids, plan.num_scheduled_tokens, plan.start_positions, plan.sample, strict=True
        ):
            token_offset += num_tokens
            if do_sample:
                state = self.seqs[seq_id]
                end = start + num_tokens
                sample_idx.append(token_offset - 1)
                rows.append(SampleRow(state.sampling, end, end - state.num_prompt_tokens))
        return sample_idx, rows

    def prepare_inputs(self, plan: StepPlan) -> StepInputs:
        seq_slots, positions = [], []
        for seq_id, num_tokens, start in zip(
            plan.seq_ids, plan.num_scheduled_tokens, plan.start_positions, strict=True
        ):
            seq_slots.append(SeqSlots(num_tokens, start, self.seqs[seq_id].block_table))
            positions.append(np.arange(start, start + num_tokens))
        sample_idx, rows = self.sample_rows(plan)
        device = self.device
        return StepInputs(
            sample_rows=rows,
            spans=prompt_spans(plan, self.seqs) if self.scoring_prompts else [],
            sample_idx=torch.tensor(sample_idx, dtype=torch.long, device=device),
            token_ids=torch.tensor(self.resolve_pending(plan), dtype=torch.long, device=device),
            positions=torch.from_numpy(np.concatenate(positions)).to(device),
            attn=AttentionContext(self.backend, self.backend.build_metadata(seq_slots, device)),
        )
