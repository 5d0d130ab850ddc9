"""One step pipeline for every runner: apply the plan's state -> prepare -> forward -> the logits
stage (logits.py) -> sample and share -> record -> draft (drafting.py, where the plan asks and
a draft model is loaded) -> a handle on the result.

`ModelRunner.launch` is that template, written once. A runner overrides only `prepare` (the
plan as tensors its forward reads), `forward` (eager or a captured graph), `record` (where the
next plan's PENDING_TOKEN inputs are read from) and `complete` (the handle): this CPU runner
finishes the step inside launch and returns a completed handle; the CUDA runner only queues the
step's work on the device. Keeps, per running sequence, what plans send only once: its block
table, prompt length and sampling settings (and, on the driver, the device state of its logit
controls). What the stages hand each other is in stages.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from itertools import compress

import numpy as np
import torch

from aioworker.compute.kv_transfer import KvCopier, NoKvCopies, WithKvReport
from aioworker.compute.layers.attention import AttentionBackend, AttentionContext
from aioworker.compute.layers.attention.slots import SeqSlots
from aioworker.compute.parallel import TensorParallel
from aioworker.compute.sampling.controls import SamplingControls, StepControls
from aioworker.compute.sampling.logprobs import StepLogprobs, prompt_spans, score_prompts
from aioworker.compute.sampling.sampler import Sampler, SampleRow
from aioworker.compute.sampling.verify import DraftRows, verify
from aioworker.compute.step.drafting import NextDrafts, propose_next_drafts
from aioworker.compute.step.logits import RefusedTokens, logits_stage, refused_tokens
from aioworker.compute.step.mask_mailbox import MaskMailbox
from aioworker.compute.step.stages import (
    CompletedStep,
    Forwarded,
    PlanError,
    PreparedStep,
    Sampled,
    StepHandle,
    StepInputs,
)
from aioworker.core.grammar import StepMasks
from aioworker.core.plan import PENDING_TOKEN, SamplingSettings, StepPlan, StepResult

# A weights update names a separate draft's tensors with this prefix (weight_models).
DRAFT_PREFIX = "draft."


@dataclass(slots=True)
class _SeqState:
    block_table: list[int]
    num_prompt_tokens: int
    sampling: SamplingSettings
    last_sampled: int = PENDING_TOKEN  # fills the next plan's PENDING_TOKEN input
    # Prompt (then outputs) where prompt logprobs or logit controls need them (NewSeq.token_ids).
    token_ids: list[int] | None = None


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        sampler: Sampler,
        device: torch.device,
        tp: TensorParallel,
        draft=None,
    ) -> None:
        """`draft`: the draft model where the executor drafts (models/self_draft.py or
        models/separate_draft.py), else None."""
        self.model = model
        self.draft = draft
        self.backend = backend
        self.sampler = sampler
        self.device = device
        self.tp = tp
        self.seqs: dict[int, _SeqState] = {}
        # Sequences that asked for prompt logprobs: steps without any skip looking for them.
        self.scoring_prompts: set[int] = set()
        # Only the driver samples, so only it keeps the controls' state and takes grammar masks.
        self.controls = SamplingControls(device, model.lm_head.vocab_size)
        self.masks = MaskMailbox()
        # Sequences whose rows follow a grammar: steps without any never look for masks.
        self.guided_seq_ids: set[int] = set()
        # Held while masks are unpacked on the executor's stream from another thread, and while
        # CUDA graphs are captured on it: a capture forbids other work on its stream.
        self.masks_lock = threading.Lock()
        # Copies of KV blocks to and from another tier (compute/kv_transfer.py).
        self.kv_copies: KvCopier = NoKvCopies()

    def kv_layers(self) -> list:
        """Every attention layer with a KV cache: the target's, then a separate draft's."""
        draft_layers = self.draft.attention_layers() if self.draft is not None else []
        return self.model.attention_layers() + draft_layers

    def weight_models(self) -> dict[str, torch.nn.Module]:
        """The modules whose weights this rank holds, by the prefix their tensors take in a
        weights update: the target's (none), and a separate draft's ("draft.")."""
        models = {"": self.model}
        if self.draft is not None and self.draft.owns_cache:
            models[DRAFT_PREFIX] = self.draft.model
        return models

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
        if plan.kv is not None:
            self.kv_copies.issue(plan.kv)
        step = self.launch_step(plan)
        if self.kv_copies.is_idle:
            return step
        return WithKvReport(step, self.kv_copies, wait=plan.is_empty)

    def launch_step(self, plan: StepPlan) -> StepHandle:
        if plan.is_empty:
            return CompletedStep(StepResult(plan.step_id, []))
        step = self.prepare(plan)
        out = self.forward(plan, step)
        if self.draft is not None and self.draft.owns_cache:
            self.catch_up_draft(plan, step)  # before `record`: it reads this step's inputs
        if not step.sample_rows and not step.spans:
            return CompletedStep(StepResult(plan.step_id, []))
        extra = StepLogprobs([row.sampling.logprobs for row in step.sample_rows])
        if step.spans:
            extra.spans = step.spans
            extra.prompt = score_prompts(
                out.hidden, step.spans, self.model.compute_logits, self.tp.is_driver
            )
        sampled = None
        if step.sample_rows:
            logits = out.logits
            if logits is None:
                logits = self.model.compute_logits(out.hidden[step.sample_idx])
            masks = self.take_masks(plan, step)
            sampled = self.sample(plan, step, logits_stage(logits, step.sample_rows, masks), extra)
            if plan.drafts_next:
                sampled.next_drafts = self.draft_next(plan, step, sampled)
        if not self.tp.is_driver:
            return CompletedStep(StepResult(plan.step_id, []))
        return self.complete(plan.step_id, sampled, extra)

    def sample(
        self, plan: StepPlan, step: PreparedStep, logits: torch.Tensor, extra: StepLogprobs
    ) -> Sampled:
        """The driver samples (or verifies drafts); every rank gets its tokens and records them
        for the next plan."""
        sampled = None
        if self.tp.is_driver:
            controls = self.step_controls(plan, step)
            if step.drafts is None:
                tokens, extra.tokens = self.sampler.sample(logits, step.sample_rows, controls)
                sampled = Sampled(tokens)
            else:
                tokens, counts, extra.tokens = verify(
                    self.sampler, logits, step.sample_rows, step.drafts, controls
                )
                sampled = Sampled(tokens, counts, step.drafts)
        sampled = self.share_samples(sampled, step)
        self.record(plan, step, sampled)
        return sampled

    def receive_masks(self, masks: StepMasks) -> None:
        """A step's masks, from the thread that filled them: unpacked there (on a GPU, queued
        on the executor's stream by the caller), so the step waiting for them only applies them."""
        vocab_size = self.model.lm_head.vocab_size
        with self.masks_lock:
            refused = refused_tokens(masks, self.device, vocab_size)
        self.masks.put(refused)

    def take_masks(self, plan: StepPlan, step: PreparedStep) -> RefusedTokens | None:
        """The driver waits here for the grammar masks of a step with a guided row; they are
        filled while this step's forward runs (on a GPU, queued before the wait)."""
        if not self.guided_seq_ids or not any(
            seq_id in self.guided_seq_ids for seq_id in compress(plan.seq_ids, plan.sample)
        ):
            return None
        return self.masks.take(plan.step_id)

    # -- what a runner overrides --------------------------------------------------------------

    def prepare(self, plan: StepPlan) -> PreparedStep:
        return self.prepare_inputs(plan)

    def forward(self, plan: StepPlan, step: StepInputs) -> Forwarded:
        return Forwarded(self.model(step.token_ids, step.positions, step.attn))

    def catch_up_draft(self, plan: StepPlan, step: StepInputs) -> None:
        """A draft with its own cache writes its KV for this step's input tokens."""
        self.draft(step.token_ids, step.positions, step.attn)  # its KV; the output unused

    def record(self, plan: StepPlan, step: PreparedStep, sampled: Sampled) -> None:
        self.remember_samples(plan, sampled.last_tokens().tolist())

    def complete(self, step_id: int, sampled: Sampled | None, extra: StepLogprobs) -> StepHandle:
        if sampled is None:
            return CompletedStep(extra.result(step_id, []))
        return CompletedStep(sampled.result(step_id, extra))

    def draft_step(
        self, seq_ids: list[int], token_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """One decode step of the draft model for these sequences: its logits [n, V]."""
        slots = [
            SeqSlots(1, position, self.seqs[seq_id].block_table)
            for seq_id, position in zip(seq_ids, positions.tolist(), strict=True)
        ]
        attn = AttentionContext(self.backend, self.backend.build_metadata(slots, self.device))
        return self.draft.compute_logits(self.draft(token_ids, positions, attn))

    # -- shared parts -------------------------------------------------------------------------

    def draft_next(self, plan: StepPlan, step: PreparedStep, sampled: Sampled) -> NextDrafts:
        """Every rank drafts (the draft's layers are sharded like the target's); each gets the
        same full logits, so the same greedy drafts, and the driver reports them."""
        if self.draft is None:
            raise PlanError(f"step {plan.step_id} asks for drafts, and no draft model is loaded")
        positions = np.fromiter((row.position for row in step.sample_rows), np.int64)
        if step.drafts is not None:
            rows_per_seq = np.asarray(step.drafts.rows_per_seq)
            positions = positions[np.cumsum(rows_per_seq) - rows_per_seq]
        return propose_next_drafts(
            plan, positions, sampled.last_tokens(), sampled.counts, self.draft_step
        )

    def remember_samples(self, plan: StepPlan, token_ids: list[int]) -> None:
        sampled_ids = [
            s for s, do_sample in zip(plan.seq_ids, plan.sample, strict=True) if do_sample
        ]
        for seq_id, token in zip(sampled_ids, token_ids, strict=True):
            self.seqs[seq_id].last_sampled = token

    def step_controls(self, plan: StepPlan, step: PreparedStep) -> StepControls | None:
        """The rows of this step's sampling that use logit controls (one check when none can)."""
        if not self.controls:
            return None
        if step.drafts is None:
            return self.controls.for_step(compress(plan.seq_ids, plan.sample))
        # A sequence with drafts has a row per draft and one more (and never uses controls).
        row_seq_ids = [
            seq_id
            for seq_id, num_rows in zip(
                compress(plan.seq_ids, plan.sample), step.drafts.rows_per_seq, strict=True
            )
            for _ in range(num_rows)
        ]
        return self.controls.for_step(row_seq_ids)

    def share_samples(self, sampled: Sampled | None, step: PreparedStep) -> Sampled:
        """Give every tensor-parallel rank the driver's sampled tokens (and counts): each needs
        them as the next step's inputs. On the driver `sampled` is given; peers pass None and
        receive."""
        if self.tp.size == 1:
            return sampled
        import torch.distributed as dist

        num_rows = len(step.sample_rows)
        num_counts = 0 if step.drafts is None else len(step.drafts.rows_per_seq)
        if sampled is None:
            shared = torch.empty(num_rows + num_counts, dtype=torch.int64, device=self.device)
        else:
            parts = [sampled.tokens.to(torch.int64)]
            if sampled.counts is not None:
                parts.append(sampled.counts.to(torch.int64))
            shared = torch.cat(parts)
        dist.broadcast(shared, src=0)
        counts = shared[num_rows:] if num_counts else None
        return Sampled(shared[:num_rows], counts, step.drafts)

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
            self.guided_seq_ids.discard(seq_id)
        if self.controls:
            self.controls.release(plan.released_seq_ids)
        for seq_id, num_blocks in plan.trimmed_block_tables:
            del self.seqs[seq_id].block_table[num_blocks:]
        for new in plan.new_seqs:
            self.seqs[new.seq_id] = _SeqState(
                [], new.num_prompt_tokens, new.sampling, token_ids=new.token_ids
            )
            if new.sampling.prompt_logprobs >= 0:
                self.scoring_prompts.add(new.seq_id)
            if new.sampling.guided and self.tp.is_driver:
                self.guided_seq_ids.add(new.seq_id)
            if new.sampling.controls is not None and self.tp.is_driver:
                self.controls.admit(new)
        for seq_id, block_ids in zip(plan.seq_ids, plan.new_block_ids, strict=True):
            state = self.seqs.get(seq_id)
            if state is None:
                raise PlanError(
                    f"step {plan.step_id} schedules sequence {seq_id}, unknown to this rank"
                )
            state.block_table.extend(block_ids)

    def sample_rows(self, plan: StepPlan) -> tuple[list[int], list[SampleRow], DraftRows | None]:
        """Batch rows whose next token is sampled, what each one samples with, and the drafts
        those rows verify (None where the plan has none)."""
        if plan.has_drafts:
            return self.draft_sample_rows(plan)
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
        return sample_idx, rows, None

    def draft_sample_rows(self, plan: StepPlan) -> tuple[list[int], list[SampleRow], DraftRows]:
        """`sample_rows` for a plan with drafts: a sequence with k drafts samples at its last
        k + 1 token rows, row j at the position of draft j (row k after the last draft)."""
        sample_idx, rows = [], []
        drafts = DraftRows([], [])
        token_offset = 0
        inputs = plan.input_token_ids
        for seq_id, num_tokens, start, num_drafts, do_sample in zip(
            plan.seq_ids,
            plan.num_scheduled_tokens,
            plan.start_positions,
            plan.num_draft_tokens,
            plan.sample,
            strict=True,
        ):
            token_offset += num_tokens
            if not do_sample:
                continue
            state = self.seqs[seq_id]
            end = start + num_tokens
            first = token_offset - 1 - num_drafts
            for j in range(num_drafts + 1):
                position = end - num_drafts + j
                sample_idx.append(first + j)
                rows.append(SampleRow(state.sampling, position, position - state.num_prompt_tokens))
            drafts.draft_ids.extend(inputs[first + 1 : token_offset])
            drafts.draft_ids.append(-1)
            drafts.rows_per_seq.append(num_drafts + 1)
        return sample_idx, rows, drafts

    def prepare_inputs(self, plan: StepPlan) -> StepInputs:
        seq_slots, positions = [], []
        for seq_id, num_tokens, start in zip(
            plan.seq_ids, plan.num_scheduled_tokens, plan.start_positions, strict=True
        ):
            seq_slots.append(SeqSlots(num_tokens, start, self.seqs[seq_id].block_table))
            positions.append(np.arange(start, start + num_tokens))
        sample_idx, rows, drafts = self.sample_rows(plan)
        device = self.device
        return StepInputs(
            drafts=drafts,
            sample_rows=rows,
            spans=prompt_spans(plan, self.seqs) if self.scoring_prompts else [],
            sample_idx=torch.tensor(sample_idx, dtype=torch.long, device=device),
            token_ids=torch.tensor(self.resolve_pending(plan), dtype=torch.long, device=device),
            positions=torch.from_numpy(np.concatenate(positions)).to(device),
            attn=AttentionContext(self.backend, self.backend.build_metadata(seq_slots, device)),
        )
