"""The GPU model runner: a persistent block-table matrix on the device, metadata built with a few
vectorised ops per step, CUDA graphs for pure decode steps, and one host sync per step (the
sampled tokens).

Every running sequence owns a row of the block-table matrix; plans append blocks to rows with
one small scatter. Row `max_num_seqs` and block `num_blocks` are scratch: padded graph rows
read and write only them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aioworker.compute.cuda_graphs import DecodeGraphs
from aioworker.compute.layers.attention import AttentionContext
from aioworker.compute.layers.attention.cuda_backend import (
    CudaAttentionMetadata,
    DecodePart,
    PrefillPart,
)
from aioworker.compute.layers.attention.triton_decode import choose_num_splits
from aioworker.compute.runner import (
    Forwarded,
    ModelRunner,
    PlanError,
    PreparedStep,
    StepHandle,
)
from aioworker.compute.sampling.logprobs import StepLogprobs, prompt_spans
from aioworker.core.plan import StepPlan, StepResult


@dataclass
class CudaStep(PreparedStep):
    """The CUDA runner's prepared step: host arrays, and whether the captured graphs run it."""

    nums: np.ndarray  # tokens per scheduled sequence
    starts: np.ndarray  # position of each one's first token
    rows: np.ndarray  # each one's row of the block-table matrix
    token_ids: np.ndarray  # the plan's input ids, PENDING_TOKEN where the device fills them
    use_graphs: bool
    sampled_rows: torch.Tensor | None = None  # set by forward: the rows whose tokens are kept


class CudaModelRunner(ModelRunner):
    def __init__(
        self,
        model,
        backend,
        sampler,
        device: torch.device,
        tp,
        *,
        block_size: int,
        num_blocks: int,
        max_num_seqs: int,
        max_model_len: int,
        max_capture_batch_size: int,
    ) -> None:
        super().__init__(model, backend, sampler, device, tp)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.scratch_row = max_num_seqs  # its block-table entries all point at block num_blocks
        self.block_table_matrix = torch.full(
            (max_num_seqs + 1, self.max_blocks_per_seq),
            num_blocks,
            dtype=torch.int32,
            device=device,
        )
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.last_tokens = torch.zeros(max_num_seqs + 1, dtype=torch.int64, device=device)
        self.rows: dict[int, int] = {}
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.num_kv_heads = model.attention_layers()[0].num_kv_heads
        self.graphs: DecodeGraphs | None = None
        self.capture_batch_size = max_capture_batch_size if backend.supports_graphs else 0
        if self.capture_batch_size > 0:
            self.graphs = DecodeGraphs(
                self, min(max_capture_batch_size, max_num_seqs), max_model_len
            )

    def drop_graphs(self) -> None:
        self.graphs = None

    def recapture_graphs(self) -> None:
        if self.capture_batch_size > 0 and self.graphs is None:
            max_batch = min(self.capture_batch_size, self.scratch_row)
            self.graphs = DecodeGraphs(self, max_batch, self.max_model_len)
            self.graphs.capture()

    # -- plan state ---------------------------------------------------------------------------

    def apply_plan_state(self, plan: StepPlan) -> None:
        for seq_id in plan.released_seq_ids:
            if self.seqs.pop(seq_id, None) is not None:
                self.free_rows.append(self.rows.pop(seq_id))
        lengths_before = {
            seq_id: len(self.seqs[seq_id].block_table)
            for seq_id in plan.seq_ids
            if seq_id in self.seqs
        }
        super().apply_plan_state(plan)
        for new in plan.new_seqs:
            if not self.free_rows:
                raise PlanError(f"step {plan.step_id} runs more sequences than max_num_seqs")
            self.rows[new.seq_id] = self.free_rows.pop()
        self._write_new_blocks(plan, lengths_before)

    def _write_new_blocks(self, plan: StepPlan, lengths_before: dict[int, int]) -> None:
        rows, cols, blocks = [], [], []
        for seq_id, new_block_ids in zip(plan.seq_ids, plan.new_block_ids, strict=True):
            if not new_block_ids:
                continue
            start = lengths_before.get(seq_id, 0)
            rows += [self.rows[seq_id]] * len(new_block_ids)
            cols += range(start, start + len(new_block_ids))
            blocks += new_block_ids
        if rows:
            update = torch.tensor([rows, cols, blocks], dtype=torch.int64).pin_memory()
            update = update.to(self.device, non_blocking=True)
            self.block_table_matrix[update[0], update[1]] = update[2].to(torch.int32)

    # -- a step -------------------------------------------------------------------------------

    def prepare(self, plan: StepPlan) -> CudaStep:
        """The plan as host arrays; the forward moves them to the device in one copy."""
        sample_idx, sample_rows = self.sample_rows(plan)
        nums = np.asarray(plan.num_scheduled_tokens, dtype=np.int64)
        spans = prompt_spans(plan, self.seqs) if self.scoring_prompts else []
        step = CudaStep(
            sample_rows=sample_rows,
            spans=spans,
            sample_idx=None,
            nums=nums,
            starts=np.asarray(plan.start_positions, dtype=np.int64),
            rows=np.asarray([self.rows[s] for s in plan.seq_ids], dtype=np.int64),
            token_ids=np.asarray(plan.input_token_ids, dtype=np.int64),
            use_graphs=self._fits_graphs(nums, spans),
        )
        if sample_rows and not step.use_graphs:
            step.sample_idx = self._to_device(np.asarray(sample_idx))
        return step

    def forward(self, plan: StepPlan, step: CudaStep) -> Forwarded:
        if step.use_graphs:
            # Every row of a decode batch samples: the graph computes all their logits.
            step.sampled_rows = self.graphs.rows[: len(step.nums)]
            return Forwarded(None, self.graphs.run(step.token_ids, step.starts, step.rows))
        step.sampled_rows = self._to_device(step.rows[np.asarray(plan.sample)])
        return Forwarded(self._forward_eager(step, plan))

    def record(self, plan: StepPlan, step: CudaStep, tokens: torch.Tensor) -> None:
        # The next plan's PENDING_TOKEN inputs are read from here, on the device.
        self.last_tokens.index_copy_(0, step.sampled_rows, tokens)

    def complete(
        self, step_id: int, tokens: torch.Tensor | None, extra: StepLogprobs
    ) -> StepHandle:
        return PendingStep(step_id, tokens, extra)

    def _fits_graphs(self, nums: np.ndarray, spans: list) -> bool:
        """Pure decode batches within the captured sizes; a step that scores prompt tokens
        needs its hidden states, which the graphs do not keep."""
        return (
            self.graphs is not None
            and not spans
            and (nums == 1).all()
            and len(nums) <= self.graphs.max_batch
        )

    def _forward_eager(self, step: CudaStep, plan: StepPlan) -> torch.Tensor:
        """Final hidden states of every token row (prefill or mixed batches, or beyond the graphs)."""
        token_ids, nums, starts, rows = step.token_ids, step.nums, step.starts, step.rows
        num_tokens = int(nums.sum())
        offsets = np.cumsum(nums) - nums
        positions = np.repeat(starts - offsets, nums) + np.arange(num_tokens)
        token_rows = np.repeat(rows, nums)
        host = np.stack([token_ids, positions, token_rows])
        device_inputs = torch.from_numpy(host).pin_memory().to(self.device, non_blocking=True)
        token_ids_t, positions_t, token_rows_t = device_inputs
        token_ids_t = self.with_pending_tokens(token_ids_t, token_rows_t)
        blocks = self.block_table_matrix[token_rows_t, positions_t // self.block_size].long()
        slot_mapping = blocks * self.block_size + positions_t % self.block_size
        meta = CudaAttentionMetadata(
            slot_mapping=slot_mapping,
            decode=self._decode_part(nums, starts, rows),
            prefill=self._prefill_part(plan, nums, starts, offsets),
        )
        return self.model(token_ids_t, positions_t, AttentionContext(self.backend, meta))

    def with_pending_tokens(
        self, token_ids: torch.Tensor, token_rows: torch.Tensor
    ) -> torch.Tensor:
        """PENDING_TOKEN inputs take the token the previous step sampled for their row."""
        return torch.where(token_ids < 0, self.last_tokens[token_rows], token_ids)

    def _decode_part(
        self, nums: np.ndarray, starts: np.ndarray, rows: np.ndarray
    ) -> DecodePart | None:
        is_decode = nums == 1
        if not is_decode.any():
            return None
        token_index = np.cumsum(nums) - 1
        index = None if is_decode.all() else self._to_device(token_index[is_decode])
        context_lens = starts[is_decode] + 1
        # Splits depend only on the batch size, as in the graphs, so eager and graph steps agree.
        num_decodes = int(is_decode.sum())
        splits = choose_num_splits(num_decodes, self.num_kv_heads, self.max_model_len, self.num_sms)
        block_tables = self.block_table_matrix.index_select(0, self._to_device(rows[is_decode]))
        context_lens_t = self._to_device(context_lens, torch.int32)
        return DecodePart(index, block_tables, context_lens_t, splits, context_lens.tolist())

    def _prefill_part(
        self, plan: StepPlan, nums: np.ndarray, starts: np.ndarray, offsets: np.ndarray
    ) -> PrefillPart | None:
        is_prefill = nums > 1
        if not is_prefill.any():
            return None
        q_lens, k_lens = nums[is_prefill], (starts + nums)[is_prefill]
        token_rows = np.concatenate(
            [np.arange(o, o + n) for o, n in zip(offsets[is_prefill], q_lens, strict=True)]
        )
        context_slots = None
        if (starts[is_prefill] > 0).any():
            seq_ids = np.asarray(plan.seq_ids)[is_prefill]
            context_slots = self._to_device(
                np.concatenate(
                    [self._context_slots(s, int(k)) for s, k in zip(seq_ids, k_lens, strict=True)]
                )
            )
        return PrefillPart(
            rows=None if is_prefill.all() else self._to_device(token_rows),
            cu_seqlens_q=self._to_device(np.concatenate([[0], np.cumsum(q_lens)]), torch.int32),
            cu_seqlens_k=self._to_device(np.concatenate([[0], np.cumsum(k_lens)]), torch.int32),
            max_q=int(q_lens.max()),
            max_k=int(k_lens.max()),
            context_slots=context_slots,
        )

    def _context_slots(self, seq_id: int, length: int) -> np.ndarray:
        positions = np.arange(length)
        blocks = np.asarray(self.seqs[int(seq_id)].block_table, dtype=np.int64)[
            positions // self.block_size
        ]
        return blocks * self.block_size + positions % self.block_size

    def _to_device(self, array: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return (
            torch.from_numpy(np.ascontiguousarray(array))
            .to(dtype)
            .pin_memory()
            .to(self.device, non_blocking=True)
        )


class PendingStep:
    """A launched step: its sampled tokens and any logprobs are being copied to pinned host
    memory, all behind one event."""

    def __init__(self, step_id: int, tokens: torch.Tensor | None, extra: StepLogprobs) -> None:
        self.step_id = step_id
        self.host = None
        if tokens is not None:
            self.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.host.copy_(tokens, non_blocking=True)
        self.extra = extra.to_host()
        self.done = torch.cuda.Event()
        self.done.record()

    def result(self) -> StepResult:
        """The step's one host synchronisation; called on the executor's completion thread."""
        self.done.synchronize()
        tokens = self.host.tolist() if self.host is not None else []
        return self.extra.result(self.step_id, tokens)
