"""The GPU model runner: a persistent block-table matrix on the device, metadata built with a few
vectorised ops per step, CUDA graphs for pure decode steps (and for verify and draft steps where
speculation is configured), and one host sync per step (the sampled tokens).

Every running sequence owns a row of the block-table matrix; plans append blocks to rows with
one small scatter. Row `max_num_seqs` and block `num_blocks` are scratch: padded graph rows
read and write only them.
"""

from __future__ import annotations

import numpy as np
import torch

from aioworker.compute.layers import pdl
from aioworker.compute.layers.attention import AttentionContext
from aioworker.compute.layers.attention.cuda_backend import (
    CudaAttentionMetadata,
    DecodePart,
    PrefillPart,
)
from aioworker.compute.layers.attention.triton_decode import choose_num_splits
from aioworker.compute.sampling.logprobs import StepLogprobs, prompt_spans
from aioworker.compute.step.cuda_graphs import MAX_VERIFY_GRAPH_BATCH, DecodeGraphs
from aioworker.compute.step.cuda_step import CudaStep, PendingStep
from aioworker.compute.step.runner import ModelRunner
from aioworker.compute.step.stages import Forwarded, PlanError, Sampled, StepHandle
from aioworker.core.plan import StepPlan


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
        max_verify_queries: int = 0,
        draft=None,
    ) -> None:
        """`max_verify_queries`: speculative decoding's drafts + 1 per sequence (0: none), the
        query slots of the verify graphs. `draft`: the draft model, whose decode steps get
        graphs of their own."""
        super().__init__(model, backend, sampler, device, tp, draft)
        self.scratch_block = num_blocks
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
        self.verify_graphs: DecodeGraphs | None = None
        self.draft_graphs: DecodeGraphs | None = None
        self.capture_batch_size = max_capture_batch_size if backend.supports_graphs else 0
        self.max_verify_queries = max_verify_queries if backend.verifies_paged else 0
        self._make_graphs()

    def drop_graphs(self) -> None:
        self.graphs = self.verify_graphs = self.draft_graphs = None

    def recapture_graphs(self) -> None:
        if self.capture_batch_size > 0 and self.graphs is None:
            self.capture_graphs()

    def capture_graphs(self) -> None:
        """Capture the decode graphs, and the verify graphs where speculation is configured."""
        with self.masks_lock:  # no mask is unpacked on this stream while a graph is captured
            if self.graphs is None:
                self._make_graphs()
            for graphs in (self.graphs, self.verify_graphs, self.draft_graphs):
                if graphs is not None:
                    graphs.capture()

    def _make_graphs(self) -> None:
        if self.capture_batch_size <= 0:
            return
        max_batch = min(self.capture_batch_size, self.scratch_row)
        self.graphs = self._graphs(self.graph_forward, max_batch, 1)
        if self.max_verify_queries > 1:
            # Verify steps pay where batches are small; larger ones run eagerly. So do drafts.
            small = min(max_batch, MAX_VERIFY_GRAPH_BATCH)
            self.verify_graphs = self._graphs(self.graph_forward, small, self.max_verify_queries)
            if self.draft is not None:
                self.draft_graphs = self._graphs(self.draft_graph_forward, small, 1)

    def _graphs(self, forward, max_batch: int, queries: int) -> DecodeGraphs:
        return DecodeGraphs(
            forward, max_batch, self.scratch_row, self.num_splits, self.device, queries
        )

    def num_splits(self, batch_size: int) -> int:
        return choose_num_splits(batch_size, self.num_kv_heads, self.max_model_len, self.num_sms)

    def graph_forward(
        self, token_ids, positions, rows, query_lens, num_splits: int
    ) -> torch.Tensor:
        # Captured (and warmed) with programmatic dependent launch only up to its batch limit.
        with pdl.for_graph_batch(len(rows)):
            return self._decode_forward(
                self.model, token_ids, positions, rows, query_lens, num_splits
            )

    def draft_graph_forward(
        self, token_ids, positions, rows, query_lens, num_splits: int
    ) -> torch.Tensor:
        return self._decode_forward(self.draft, token_ids, positions, rows, query_lens, num_splits)

    def draft_step(
        self, seq_ids: list[int], token_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """One draft decode step, in the draft graphs where the batch fits them; its inputs
        stay on the device (positions follow the counts the step's verification kept)."""
        rows = self._to_device(np.asarray([self.rows[s] for s in seq_ids]))
        graphs = self.draft_graphs
        if graphs is not None and len(seq_ids) <= graphs.max_batch:
            return graphs.run_on_device(token_ids, positions, rows)
        splits = self.num_splits(len(seq_ids))
        return self.draft_graph_forward(token_ids, positions, rows, None, splits)

    def _decode_forward(
        self, model, token_ids, positions, rows, query_lens, num_splits: int
    ) -> torch.Tensor:
        """Logits [B * Q, V] for B sequences of Q query slots (Q = 1: a decode step; else a
        verify step, a sequence's slots past its query count writing only the scratch block),
        every op graph-safe: what the graphs capture."""
        batch = rows.shape[0]
        queries = token_ids.shape[0] // batch
        block_size = self.block_size
        block_tables = self.block_table_matrix.index_select(0, rows)  # [B, max_blocks]
        token_rows = rows if queries == 1 else rows.repeat_interleave(queries)
        slot_blocks = (
            block_tables.repeat_interleave(queries, dim=0) if queries > 1 else block_tables
        )
        blocks = slot_blocks.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1).long()
        slot_mapping = blocks * block_size + positions % block_size
        token_ids = self.with_pending_tokens(token_ids, token_rows)
        if queries == 1:
            part = DecodePart(None, block_tables, (positions + 1).to(torch.int32), num_splits)
        else:
            slot = torch.arange(batch * queries, device=rows.device) % queries
            real = slot < query_lens.repeat_interleave(queries)
            slot_mapping = torch.where(real, slot_mapping, self.scratch_block * block_size)
            context_lens = (positions.view(batch, queries)[:, 0] + query_lens).to(torch.int32)
            first_rows = torch.arange(batch, device=rows.device, dtype=torch.int32) * queries
            lens = query_lens.to(torch.int32)
            part = DecodePart(
                None, block_tables, context_lens, num_splits, queries=(first_rows, lens, queries)
            )
        meta = CudaAttentionMetadata(slot_mapping, part, None)
        hidden = model(token_ids, positions, AttentionContext(self.backend, meta))
        return model.compute_logits(hidden)

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
        # A cut table's rows past its end are stale; the new blocks are written from there.
        lengths_before.update(plan.trimmed_block_tables)
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
        sample_idx, sample_rows, drafts = self.sample_rows(plan)
        nums = np.asarray(plan.num_scheduled_tokens, dtype=np.int64)
        spans = prompt_spans(plan, self.seqs) if self.scoring_prompts else []
        step = CudaStep(
            drafts=drafts,
            sample_rows=sample_rows,
            spans=spans,
            sample_idx=None,
            nums=nums,
            starts=np.asarray(plan.start_positions, dtype=np.int64),
            rows=np.asarray([self.rows[s] for s in plan.seq_ids], dtype=np.int64),
            token_ids=np.asarray(plan.input_token_ids, dtype=np.int64),
            use_graphs=self._fits_graphs(nums, spans),
        )
        step.use_verify_graphs = drafts is not None and self._fits_verify_graphs(plan, nums, spans)
        if sample_rows and not step.use_graphs:
            step.sample_idx = self._to_device(np.asarray(sample_idx))
        return step

    def forward(self, plan: StepPlan, step: CudaStep) -> Forwarded:
        if step.use_graphs:
            # Every row of a decode batch samples: the graph computes all their logits.
            step.sampled_rows = self.graphs.rows[: len(step.nums)]
            return Forwarded(None, self.graphs.run(step.token_ids, step.starts, step.rows))
        if step.use_verify_graphs:
            step.sampled_rows = self._to_device(step.rows)
            return Forwarded(None, self._run_verify_graph(step))
        step.sampled_rows = self._to_device(step.rows[np.asarray(plan.sample)])
        return Forwarded(self.forward_eager(step, plan))

    def catch_up_draft(self, plan: StepPlan, step: CudaStep) -> None:
        """A separate draft's KV for this step's inputs: a decode step in the draft graphs
        where the batch fits them, any other step eagerly."""
        graphs = self.draft_graphs
        if step.use_graphs and graphs is not None and len(step.nums) <= graphs.max_batch:
            graphs.run(step.token_ids, step.starts, step.rows)
        else:
            self.forward_eager(step, plan, self.draft)

    def record(self, plan: StepPlan, step: CudaStep, sampled: Sampled) -> None:
        # The next plan's PENDING_TOKEN inputs are read from here, on the device.
        self.last_tokens.index_copy_(0, step.sampled_rows, sampled.last_tokens())

    def complete(self, step_id: int, sampled: Sampled | None, extra: StepLogprobs) -> StepHandle:
        return PendingStep(step_id, sampled, extra)

    def _fits_verify_graphs(self, plan: StepPlan, nums: np.ndarray, spans: list) -> bool:
        """A verify step whose sequences all decode or verify (one known token each, then at
        most Q - 1 drafts) within the verify graphs' sizes."""
        graphs = self.verify_graphs
        return (
            graphs is not None
            and not spans
            and len(nums) <= graphs.max_batch
            and int(nums.max()) <= graphs.queries
            and ((nums - np.asarray(plan.num_draft_tokens)) == 1).all()
        )

    def _run_verify_graph(self, step: CudaStep) -> torch.Tensor:
        """The sampled rows' logits: each sequence's queries laid into Q slots, the rest
        padding (its first position again, writing the scratch block)."""
        queries, nums = self.verify_graphs.queries, step.nums
        batch = len(nums)
        slot = np.tile(np.arange(queries), batch)
        real = slot < np.repeat(nums, queries)
        token_ids = np.zeros(batch * queries, dtype=np.int64)
        token_ids[real] = step.token_ids
        positions = np.repeat(step.starts, queries) + np.where(real, slot, 0)
        logits = self.verify_graphs.run(token_ids, positions, step.rows, nums)
        kept = np.flatnonzero(real)  # in sequence order, each one's queries in order
        return logits[self._to_device(kept)]

    def _fits_graphs(self, nums: np.ndarray, spans: list) -> bool:
        """Pure decode batches within the captured sizes; a step that scores prompt tokens
        needs its hidden states, which the graphs do not keep."""
        return (
            self.graphs is not None
            and not spans
            and (nums == 1).all()
            and len(nums) <= self.graphs.max_batch
        )

    def forward_eager(self, step: CudaStep, plan: StepPlan, model=None) -> torch.Tensor:
        """Final hidden states of every token row (prefill or mixed batches, or beyond the
        graphs), of the target or, for its catch-up, the draft."""
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
        paged = self._paged_rows(plan, nums)
        meta = CudaAttentionMetadata(
            slot_mapping=slot_mapping,
            decode=self._decode_part(nums, starts, rows, paged),
            prefill=self._prefill_part(plan, nums, starts, offsets, ~paged),
        )
        model = self.model if model is None else model
        return model(token_ids_t, positions_t, AttentionContext(self.backend, meta))

    def with_pending_tokens(
        self, token_ids: torch.Tensor, token_rows: torch.Tensor
    ) -> torch.Tensor:
        """PENDING_TOKEN inputs take the token the previous step sampled for their row."""
        return torch.where(token_ids < 0, self.last_tokens[token_rows], token_ids)

    def _paged_rows(self, plan: StepPlan, nums: np.ndarray) -> np.ndarray:
        """Sequences attended by the paged decode kernel: decodes, and where the backend can,
        verify steps (their drafts are a few query tokens each)."""
        paged = nums == 1
        if plan.has_drafts and self.backend.verifies_paged:
            paged |= np.asarray(plan.num_draft_tokens) > 0
        return paged

    def _decode_part(
        self, nums: np.ndarray, starts: np.ndarray, rows: np.ndarray, is_decode: np.ndarray
    ) -> DecodePart | None:
        if not is_decode.any():
            return None
        queries = None
        if (nums[is_decode] > 1).any():
            query_lens = nums[is_decode]
            first_rows = np.cumsum(query_lens) - query_lens
            ends = np.cumsum(nums)[is_decode]
            token_index = np.concatenate(
                [np.arange(e - n, e) for e, n in zip(ends, query_lens, strict=True)]
            )
            queries = (
                self._to_device(first_rows, torch.int32),
                self._to_device(query_lens, torch.int32),
                int(query_lens.max()),
            )
        else:
            token_index = (np.cumsum(nums) - 1)[is_decode]
        index = None if is_decode.all() else self._to_device(token_index)
        context_lens = (starts + nums)[is_decode]
        # Splits depend only on the batch size, as in the graphs, so eager and graph steps agree.
        num_decodes = int(is_decode.sum())
        splits = choose_num_splits(num_decodes, self.num_kv_heads, self.max_model_len, self.num_sms)
        block_tables = self.block_table_matrix.index_select(0, self._to_device(rows[is_decode]))
        context_lens_t = self._to_device(context_lens, torch.int32)
        return DecodePart(
            index, block_tables, context_lens_t, splits, context_lens.tolist(), queries
        )

    def _prefill_part(
        self,
        plan: StepPlan,
        nums: np.ndarray,
        starts: np.ndarray,
        offsets: np.ndarray,
        is_prefill: np.ndarray,
    ) -> PrefillPart | None:
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
