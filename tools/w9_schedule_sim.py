"""Simulate W9's scheduling (aioworker/bench/gpu_host_tier.py) without a model: the real
Scheduler, BlockManager and host tier on W9's draws, with a linear step-time model and copies at
a fixed rate that end when they would. It counts preemptions and swaps, and estimates output
tok/s and TTFT with the host tier off and on, in seconds, on a CPU. A model of the H200, not a
measurement of it: `aioworker bench --workload w9` measures.

    python tools/w9_schedule_sim.py [--users 128] [--step-ms 7.0] [--ms-per-token 0.03]
"""

from __future__ import annotations

import argparse
import collections
import statistics

from aioworker.bench.gpu_host_tier import ChatScale, draw, size
from aioworker.core.block_manager import BlockManager
from aioworker.core.host_tier import HostKvConnector
from aioworker.core.kv_connector import KvReport
from aioworker.core.plan import StepResult
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence

BLOCK_SIZE = 16
BLOCK_BYTES = 2 << 20  # Llama-3.1-8B: 32 layers x K and V x 8 heads x 128 x bf16 x 16 tokens


class Simulation:
    def __init__(self, args: argparse.Namespace, tier: bool) -> None:
        self.args = args
        self.scale = ChatScale(num_users=args.users)
        self.conversations = draw(self.scale)
        sizing = size(self.conversations, self.scale, BLOCK_SIZE, BLOCK_BYTES)
        blocks = BlockManager(sizing.num_device_blocks, BLOCK_SIZE, enable_prefix_caching=True)
        self.connector = None
        if tier:
            num_slots = sizing.host_kv_bytes // BLOCK_BYTES
            self.connector = HostKvConnector(num_slots, BLOCK_SIZE, BLOCK_BYTES, "auto")
        self.sched = Scheduler(blocks, 256, 2048, sizing.max_model_len, connector=self.connector)
        self.params = SamplingParams(
            temperature=0.0, max_tokens=self.scale.new_tokens, ignore_eos=True
        )
        self.prompts = [c.system + c.messages[0] for c in self.conversations]
        self.turns = [0] * args.users
        self.added: dict[str, tuple[float, int, Sequence]] = {}
        self.ttft: list[float] = []
        self.now = 0.0
        self.copies: collections.deque[tuple[float, int]] = collections.deque()
        self.copy_free_at = 0.0
        self.num_seqs = 0

    def add(self, user: int) -> None:
        seq = Sequence(self.num_seqs, f"{user}:{self.turns[user]}", self.prompts[user], self.params)
        self.num_seqs += 1
        self.sched.add(seq)
        self.added[seq.request_id] = (self.now, user, seq)

    def step(self) -> int:
        """One plan, run in model time; returns the output tokens it gave."""
        plan = self.sched.schedule()
        if plan.kv is not None:
            for copy in plan.kv.saves + plan.kv.loads:
                seconds = len(copy.device_block_ids) * BLOCK_BYTES / (self.args.copy_gbs * 1e9)
                self.copy_free_at = max(self.copy_free_at, self.now) + seconds
                self.copies.append((self.copy_free_at, copy.transfer_id))
        if plan.seq_ids:
            self.now += (self.args.step_ms + self.args.ms_per_token * plan.num_tokens) / 1e3
        elif self.copies:  # a plan of copies only: the executor waits for them all
            self.now = max(self.now, self.copies[-1][0])
        done = []
        while self.copies and self.copies[0][0] <= self.now:
            done.append(self.copies.popleft()[1])
        result = StepResult(plan.step_id, [1] * sum(plan.sample), kv=KvReport(done))
        return sum(self.take(out) for out in self.sched.update(plan, result))

    def take(self, out) -> int:
        added_at, user, seq = self.added[out.request_id]
        if len(seq.token_ids) - seq.num_prompt_tokens == len(out.token_ids):
            self.ttft.append(self.now - added_at)  # its first tokens
        if out.finish_reason is not None:
            del self.added[out.request_id]
            self.turns[user] += 1
            if self.turns[user] < self.scale.num_turns:
                self.prompts[user] = (
                    seq.token_ids + self.conversations[user].messages[self.turns[user]]
                )
                self.add(user)
        return len(out.token_ids)

    def run(self) -> dict:
        for user in range(self.args.users):
            self.add(user)
        num_tokens = 0
        while self.sched.has_work:
            num_tokens += self.step()
        stats = self.connector.stats() if self.connector else {}
        return {
            "model seconds": round(self.now, 1),
            "output tok/s": round(num_tokens / self.now),
            "mean TTFT s": round(statistics.mean(self.ttft), 2),
            "preemptions": self.sched.num_preemptions,
            "host hits": stats.get("host_kv_hit_blocks", 0),
            "swaps": stats.get("host_kv_swaps_out", 0),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=7.0, help="a step's fixed cost")
    parser.add_argument("--ms-per-token", type=float, default=0.03, help="and per token")
    parser.add_argument("--copy-gbs", type=float, default=22.0, help="host copies, GB/s")
    args = parser.parse_args()
    for tier in (False, True):
        print(f"host tier {'on' if tier else 'off'}:", Simulation(args, tier).run(), flush=True)


if __name__ == "__main__":
    main()
