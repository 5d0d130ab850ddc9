"""Plan -> input tensors (token ids, positions, cache slots, attention metadata) -> forward -> sample.

Keeps, per running sequence, what plans send only once: its block table, prompt length and
sampling spec.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aioworker.layers.attention import AttentionContext
from aioworker.layers.attention.slots import SeqSlots
from aioworker.parallel import TensorParallel
from aioworker.plan import SamplingSpec, StepPlan, StepResult
from aioworker.sampling import Sampler, SampleRow


class PlanError(RuntimeError):
    """A plan refers to state this rank does not have: the ranks have diverged."""


@dataclass(slots=True)
class _SeqState:
    block_table: list[int]
    num_prompt_tokens: int
    sampling: SamplingSpec


@dataclass
class StepInputs:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionContext
    sample_idx: torch.Tensor  # [S] rows of the batch whose next token is sampled
    sample_rows: list[SampleRow]


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

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        self.apply_plan_state(plan)
        if plan.is_empty:
            return StepResult(plan.step_id, [])
        inputs = self.prepare_inputs(plan)
        hidden = self.model(inputs.token_ids, inputs.positions, inputs.attn)
        if not inputs.sample_rows:
            return StepResult(plan.step_id, [])
        logits = self.model.compute_logits(hidden[inputs.sample_idx])
        if not self.tp.is_driver:
            return StepResult(plan.step_id, [])
        return StepResult(plan.step_id, self.sampler(logits, inputs.sample_rows).tolist())

    def apply_plan_state(self, plan: StepPlan) -> None:
        for seq_id in plan.released_seq_ids:
            self.seqs.pop(seq_id, None)
        for new in plan.new_seqs:
            self.seqs[new.seq_id] = _SeqState([], new.num_prompt_tokens, new.sampling)
        for seq_id, block_ids in zip(plan.seq_ids, plan.new_block_ids, strict=True):
            state = self.seqs.get(seq_id)
            if state is None:
                raise PlanError(
                    f"step {plan.step_id} schedules sequence {seq_id}, unknown to this rank"
                )
            state.block_table.extend(block_ids)

    def prepare_inputs(self, plan: StepPlan) -> StepInputs:
        seq_slots, positions, sample_idx, rows = [], [], [], []
        token_offset = 0
        for seq_id, num_tokens, start, do_sample in zip(
            plan.seq_ids, plan.num_scheduled_tokens, plan.start_positions, plan.sample, strict=True
        ):
            state = self.seqs[seq_id]
            seq_slots.append(SeqSlots(num_tokens, start, state.block_table))
            positions.append(np.arange(start, start + num_tokens))
            token_offset += num_tokens
            if do_sample:
                sample_idx.append(token_offset - 1)
                end = start + num_tokens
                rows.append(SampleRow(state.sampling, end, end - state.num_prompt_tokens))
        device = self.device
        return StepInputs(
            token_ids=torch.tensor(plan.input_token_ids, dtype=torch.long, device=device),
            positions=torch.from_numpy(np.concatenate(positions)).to(device),
            attn=AttentionContext(self.backend, self.backend.build_metadata(seq_slots, device)),
            sample_idx=torch.tensor(sample_idx, dtype=torch.long, device=device),
            sample_rows=rows,
        )
