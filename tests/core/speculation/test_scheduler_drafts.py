"""Drafts through the engine core and the fake executor, whose greedy 'model' samples
fake_token(position): speculation must give exactly the tokens decoding one at a time gives,
whatever the drafts, the cache size, the budget or the stop conditions."""

from __future__ import annotations

import random

import pytest

from aioworker.config import SpeculativeOptions, load_config
from aioworker.core.engine_core import EngineCore
from aioworker.core.fake_executor import FakeExecutor, fake_loaded_rank, fake_token
from aioworker.core.plan import PENDING_TOKEN
from aioworker.core.sampling_params import SamplingParams
from tests.core.speculation.executor_tables import ExecutorTables

K = 4


class OracleProposer:
    """Proposes the fake model's own tokens, each wrong with probability `error`."""

    def __init__(self, error: float, seed: int = 0) -> None:
        self.error = error
        self.rng = random.Random(seed)
        self.calls = 0

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        self.calls += 1
        drafts = [fake_token(len(token_ids) + i) for i in range(max_tokens)]
        return [7 if self.rng.random() < self.error else t for t in drafts]


class CheckingExecutor(FakeExecutor):
    """The fake executor, which first checks that every plan computes each sequence's true
    tokens at the right positions: prompt tokens, then fake_token(position), drafts aside."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: dict[int, list[int]] = {}
        self.num_plans_with_drafts = 0
        self.core: EngineCore | None = None
        self.tables = ExecutorTables()

    def submit(self, plan):
        self.num_plans_with_drafts += plan.has_drafts
        self.tables.follow(plan, self.core.scheduler.seqs)
        self._check_draft_slots(plan)
        end = 0
        drafts = plan.num_draft_tokens or [0] * len(plan.seq_ids)
        for seq_id, start, num, num_drafts in zip(
            plan.seq_ids, plan.start_positions, plan.num_scheduled_tokens, drafts, strict=True
        ):
            assert num >= 1
            inputs = plan.input_token_ids[end : end + num - num_drafts]
            end += num
            prompt = self.prompts[seq_id]
            for position, token in enumerate(inputs, start):
                truth = prompt[position] if position < len(prompt) else fake_token(position)
                assert token in (truth, PENDING_TOKEN), (seq_id, position, token, truth)
        return super().submit(plan)

    def _check_draft_slots(self, plan) -> None:
        """Where the executor drafts after the step, the sequence's table has a slot for each
        draft's KV, even when every draft it verifies is accepted."""
        if not plan.drafts_next:
            return
        block_size = self.core.block_manager.block_size
        for seq_id, start, num, k in zip(
            plan.seq_ids,
            plan.start_positions,
            plan.num_scheduled_tokens,
            plan.num_next_drafts,
            strict=True,
        ):
            if k:
                assert len(self.tables.tables[seq_id]) * block_size >= start + num + k


EXECUTOR = "the executor drafts"


def make_core(proposer=None, **overrides) -> EngineCore:
    """`proposer`: None (no speculation), a Proposer (n-gram's seam) or EXECUTOR (drafts come
    with each step's result, as a draft model's do: fake_draft)."""
    settings = {"cache.num_blocks": 64, "model.max_model_len": 256, **overrides}
    config = load_config(overrides=settings)
    speculative = None
    if proposer is not None:
        method = "draft" if proposer is EXECUTOR else "ngram"
        speculative = SpeculativeOptions(method=method, num_tokens=K, dynamic=False)
    core = EngineCore(
        CheckingExecutor(),
        fake_loaded_rank(config),
        config.scheduler,
        enable_prefix_caching=config.cache.enable_prefix_caching,
        speculative=speculative,
    )
    if proposer not in (None, EXECUTOR):
        core.scheduler.speculator.proposer = proposer
    core.executor.core = core
    return core


def run(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]):
    for request_id, (prompt, params) in requests.items():
        core.add(request_id, prompt, params)
        for seq in core.scheduler.seqs_by_request[request_id]:
            core.executor.prompts[seq.seq_id] = prompt
    tokens = {request_id: [] for request_id in requests}
    reasons, steps = {}, 0
    while core.has_unfinished or core.in_flight:
        for out in core.step():
            tokens[out.request_id] += out.token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        steps += 1
    return tokens, reasons, steps


def workload(seed: int, count: int = 12) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return {
        f"r{i}": (
            [rng.randrange(1, 1000) for _ in range(rng.randint(3, 40))],
            SamplingParams(max_tokens=rng.randint(1, 30)),
        )
        for i in range(count)
    }


@pytest.mark.parametrize("error", [0.0, 0.3, 1.0])
@pytest.mark.parametrize(
    "cramped",
    [{}, {"cache.num_blocks": 12, "scheduler.max_num_batched_tokens": 16}],
    ids=["roomy", "preempting-and-chunking"],
)
def test_speculation_gives_the_tokens_of_plain_decoding(error: float, cramped: dict) -> None:
    requests = workload(seed=3)
    expected, expected_reasons, plain_steps = run(make_core(**cramped), requests)
    proposer = OracleProposer(error)
    core = make_core(proposer, **cramped)
    got, reasons, steps = run(core, requests)
    assert got == expected and reasons == expected_reasons
    assert core.executor.num_plans_with_drafts > 0
    if error == 0.0 and not cramped:
        assert steps < plain_steps / 2


@pytest.mark.parametrize(
    "cramped",
    [{}, {"cache.num_blocks": 12, "scheduler.max_num_batched_tokens": 16}],
    ids=["roomy", "preempting-and-chunking"],
)
def test_drafts_made_by_the_executor_give_the_tokens_of_plain_decoding(cramped: dict) -> None:
    requests = workload(seed=5)
    expected, expected_reasons, plain_steps = run(make_core(**cramped), requests)
    core = make_core(EXECUTOR, **cramped)
    got, reasons, steps = run(core, requests)
    assert got == expected and reasons == expected_reasons
    policy = core.scheduler.speculator.policy
    # fake_draft is wrong at one position in five: most drafts are accepted, not all.
    assert 0.5 < policy.num_accepted / policy.num_proposed < 0.95
    if not cramped:
        assert steps < plain_steps / 1.5
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_a_stop_token_or_max_tokens_inside_an_accepted_run_ends_it_there() -> None:
    prompt = [5, 6, 7]
    stop = fake_token(len(prompt) + 2)  # the third output
    requests = {
        "stopped": (prompt, SamplingParams(max_tokens=50, stop_token_ids=[stop])),
        "short": (prompt, SamplingParams(max_tokens=2)),
    }
    core = make_core(OracleProposer(0.0))
    tokens, reasons, _ = run(core, requests)
    assert tokens["stopped"] == [fake_token(3), fake_token(4), stop]
    assert tokens["short"] == [fake_token(3), fake_token(4)]
    assert reasons["stopped"].value == "stop" and reasons["short"].value == "length"
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_rejected_drafts_give_their_blocks_back_and_never_enter_the_prefix_cache() -> None:
    core = make_core(OracleProposer(1.0), **{"cache.block_size": 2})
    core.add("a", [1, 2, 3], SamplingParams(max_tokens=9))
    core.executor.prompts[0] = [1, 2, 3]
    blocks = core.block_manager
    while core.has_unfinished:
        core.step()
        for seq in core.scheduler.running:
            if not seq.num_draft_tokens:
                assert len(seq.block_table) == blocks.blocks_for_tokens(len(seq.token_ids))
    cached_tokens = [token for _, ids in blocks._block_of_key for token in ids]
    assert cached_tokens and 7 not in cached_tokens  # 7: every wrong draft


def test_policy_learns_acceptance_from_verified_steps() -> None:
    core = make_core(OracleProposer(1.0))
    run(core, workload(seed=4, count=4))
    policy = core.scheduler.speculator.policy
    assert policy.num_proposed > 0 and policy.num_accepted == 0 and policy.acceptance < 0.1


def test_drafts_never_take_the_budget_of_later_sequences() -> None:
    """A budget of one token per running sequence leaves no room for drafts: every sequence
    still decodes in every step."""
    core = make_core(OracleProposer(0.0), **{"scheduler.max_num_batched_tokens": 4})
    requests = {f"r{i}": ([1 + i, 2, 3], SamplingParams(max_tokens=6)) for i in range(4)}
    for request_id, (prompt, params) in requests.items():
        core.add(request_id, prompt, params)
        core.executor.prompts[core.scheduler.seqs_by_request[request_id][0].seq_id] = prompt
    num_plans = 0
    while core.has_unfinished:
        plan = core.scheduler.schedule()
        running = core.scheduler.running
        assert len(plan.seq_ids) == len(running)  # nobody is left out for another's drafts
        if len(running) == 4 and all(s.num_computed_tokens >= 3 for s in running):
            assert not plan.has_drafts  # four decodes fill the budget
        core.scheduler.update(plan, core.executor.submit(plan).result())
        num_plans += 1
    assert num_plans >= 6
