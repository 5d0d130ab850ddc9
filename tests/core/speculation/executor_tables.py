"""Block tables as an executor keeps them, built from plans alone (releases, admissions, cuts,
new blocks): the tests compare them with the scheduler's after every plan."""

from __future__ import annotations

from aioworker.core.plan import StepPlan
from aioworker.core.sequence import Sequence


class ExecutorTables:
    def __init__(self) -> None:
        self.tables: dict[int, list[int]] = {}

    def follow(self, plan: StepPlan, seqs: dict[int, Sequence]) -> None:
        """Apply `plan`, then assert each scheduled sequence's table equals `seqs`' one."""
        for seq_id in plan.released_seq_ids:
            self.tables.pop(seq_id, None)
        for new in plan.new_seqs:
            self.tables[new.seq_id] = []
        for seq_id, num_blocks in plan.trimmed_block_tables:
            del self.tables[seq_id][num_blocks:]
        for seq_id, new_block_ids in zip(plan.seq_ids, plan.new_block_ids, strict=True):
            self.tables[seq_id].extend(new_block_ids)
            assert self.tables[seq_id] == seqs[seq_id].block_table, seq_id
