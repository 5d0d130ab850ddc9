"""Guided decoding's torch-free side: a sequence's matcher through drafts, the guided rows of a
plan, and the engine core with masks that come beside the plans (core/grammar.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from aioworker.config import load_config
from aioworker.core.engine_core import EngineCore
from aioworker.core.fake_executor import fake_loaded_rank, fake_token
from aioworker.core.grammar import PARALLEL_ROWS, MaskFiller, SequenceGrammar, guided_rows
from aioworker.core.guided import GuidedParams
from aioworker.core.outputs import ErrorKind, FinishReason
from aioworker.core.plan import StepPlan
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.sequence import Sequence
from tests.core.grammar_fakes import FakeGrammars, FixedMatcher, MaskingExecutor, lowest_allowed

CONFIG = load_config(overrides={"cache.num_blocks": 64, "model.max_model_len": 128})
STOP = 0  # the fake model's EOS
TARGET = [7, 8, 9, 10]


def guided(target: list[int] = TARGET, **fields) -> SamplingParams:
    text = " ".join(map(str, target)) if isinstance(target, list) else target
    return SamplingParams(max_tokens=20, guided=GuidedParams(regex=text), **fields)


def make_core(grammars: FakeGrammars | None = None, executor=None) -> EngineCore:
    loaded = dataclasses.replace(fake_loaded_rank(CONFIG), grammars=grammars or FakeGrammars())
    return EngineCore(executor or MaskingExecutor(), loaded, CONFIG.scheduler)


def run(core: EngineCore) -> dict:
    outputs = []
    while core.has_unfinished:
        outputs += core.step()
    by_request: dict = {}
    for out in outputs:
        tokens, reasons, errors = by_request.setdefault(out.request_id, ([], [], []))
        tokens += out.token_ids
        if out.finished:
            reasons.append(out.finish_reason)
            errors.append((out.error_kind, out.error))
    return by_request


def test_kept_tokens_reach_the_matcher_when_it_is_next_needed() -> None:
    grammar = SequenceGrammar(FixedMatcher(TARGET, [STOP]))
    grammar.keep(7)
    grammar.keep(8)
    assert grammar.matcher.accepted == []  # the scheduler's side costs nothing
    bitmask = np.zeros((1, 1), np.int32)
    grammar.fill(bitmask, 0, [])
    assert grammar.matcher.accepted == [7, 8] and lowest_allowed(bitmask[0]) == 9


def test_a_draft_prefix_stops_at_the_first_refused_draft_and_leaves_the_matcher() -> None:
    grammar = SequenceGrammar(FixedMatcher(TARGET, [STOP]))
    grammar.keep(7)
    assert grammar.valid_prefix([8, 9, 99, 10]) == [8, 9]
    assert grammar.matcher.accepted == [7]
    assert grammar.valid_prefix([5]) == []


def test_draft_rows_hold_the_mask_before_each_draft_and_after_the_last() -> None:
    grammar = SequenceGrammar(FixedMatcher(TARGET, [STOP]))
    bitmask = np.zeros((4, 1), np.int32)
    grammar.fill(bitmask, 0, [7, 8, 42])
    assert [lowest_allowed(row) for row in bitmask] == [7, 8, 9, 9]  # 42 refused: a copy
    assert grammar.matcher.accepted == []


def test_a_refused_token_breaks_the_grammar_for_good_and_frees_its_rows() -> None:
    grammar = SequenceGrammar(FixedMatcher(TARGET, [STOP]))
    grammar.keep(8)
    bitmask = np.full((1, 1), -1, np.int32)
    grammar.fill(bitmask, 0, [])
    assert grammar.is_broken and bitmask[0, 0] == -1  # unconstrained, not a dead row
    grammar.keep(7)
    grammar.catch_up()
    assert grammar.is_broken and grammar.matcher.accepted == []


def test_guided_rows_count_a_drafted_sequence_as_one_row_per_draft_and_one_more() -> None:
    seqs = {i: Sequence(i, f"r{i}", [1, 2], SamplingParams()) for i in range(3)}
    for i in (0, 2):
        seqs[i].grammar = SequenceGrammar(FixedMatcher(TARGET, [STOP]))
    plan = StepPlan(
        step_id=0,
        seq_ids=[0, 1, 2],
        num_scheduled_tokens=[3, 2, 1],
        start_positions=[5, 5, 5],
        new_block_ids=[[], [], []],
        sample=[True, True, True],
        input_token_ids=[1, 7, 8, 1, 5, 1],
        num_draft_tokens=[2, 1, 0],
    )
    rows, work, num_rows = guided_rows(plan, seqs.get)
    assert rows == [0, 1, 2, 5] and num_rows == 6  # seq 0: rows 0-2; seq 1: 3-4; seq 2: 5
    assert [(w.first, w.drafts) for w in work] == [(0, [7, 8]), (5, [])]
    assert [w.grammar for w in work] == [seqs[0].grammar, seqs[2].grammar]


def test_many_guided_rows_are_filled_on_several_threads_alike() -> None:
    provided = []
    filler = MaskFiller(2, provided.append, num_threads=3)  # 64 tokens
    seqs = {}
    for i in range(PARALLEL_ROWS * 2):
        seq = Sequence(i, f"r{i}", [1], SamplingParams())
        seq.grammar = SequenceGrammar(FixedMatcher([i + 1], [STOP]))
        seqs[i] = seq
    plan = StepPlan(
        step_id=3,
        seq_ids=list(seqs),
        num_scheduled_tokens=[1] * len(seqs),
        start_positions=[1] * len(seqs),
        new_block_ids=[[]] * len(seqs),
        sample=[True] * len(seqs),
        input_token_ids=[1] * len(seqs),
    )
    filler.fill(plan, seqs.get)
    filler.shutdown()
    [masks] = provided
    assert [lowest_allowed(row) for row in masks.bitmask] == [i + 1 for i in range(len(seqs))]


def test_a_guided_request_follows_its_grammar_and_ends_with_it_while_others_run_ahead() -> None:
    executor = MaskingExecutor()
    core = make_core(executor=executor)
    core.add("free", [1, 2, 3], SamplingParams(max_tokens=6))
    core.add("guided", [4, 5], guided())
    results = run(core)
    assert results["guided"][0] == [*TARGET, STOP]
    assert results["guided"][1] == [FinishReason.STOP]
    assert results["free"][0] == [fake_token(p) for p in range(3, 9)]
    # Masks came exactly for the steps that waited, and only steps with a guided row waited.
    assert executor.masks_provided == executor.steps_waited
    # One masked row per guided token; the step launched ahead of the last one finds its
    # sequence ended and masks nothing, yet is answered (no step ever waits forever).
    assert executor.rows_masked == [1] * (len(TARGET) + 1) + [0]


def test_steps_without_a_guided_row_never_wait_for_masks() -> None:
    executor = MaskingExecutor()
    core = make_core(executor=executor)
    core.add("free", [1, 2, 3], SamplingParams(max_tokens=5))
    run(core)
    assert executor.steps_waited == [] and executor.masks_provided == []


def test_a_grammar_ends_the_output_even_where_eos_is_ignored() -> None:
    core = make_core()
    core.add("guided", [4, 5], guided(ignore_eos=True))
    tokens, reasons, _ = run(core)["guided"]
    assert tokens == [*TARGET, STOP] and reasons == [FinishReason.STOP]


def test_samples_of_one_request_each_follow_the_grammar() -> None:
    core = make_core()
    core.add("guided", [4, 5, 6], guided(n=3, seed=1))
    outputs = []
    while core.has_unfinished:
        outputs += core.step()
    for index in range(3):
        tokens = [t for o in outputs if o.sample_index == index for t in o.token_ids]
        assert tokens == [*TARGET, STOP]


def test_a_request_whose_grammar_compiles_holds_no_slot_and_holds_nobody_up() -> None:
    grammars = FakeGrammars(hold=True)
    core = make_core(grammars)
    core.add("guided", [4, 5], guided())
    core.add("free", [1, 2, 3], SamplingParams(max_tokens=2))
    assert "guided" in core.guided and core.has_unfinished
    outputs = core.step()
    assert {o.request_id for o in outputs} == {"free"}
    assert all(seq.request_id != "guided" for seq in core.scheduler.running)
    assert core.block_manager.num_used_blocks <= 1
    grammars.release()
    tokens, reasons, _ = run(core)["guided"]
    assert tokens == [*TARGET, STOP] and reasons == [FinishReason.STOP]


def test_a_grammar_that_fails_to_compile_ends_each_sample_with_an_invalid_error() -> None:
    grammars = FakeGrammars(hold=True)
    core = make_core(grammars)
    core.add("bad", [4, 5], guided("bad", n=2, seed=0))
    core.add("free", [1, 2, 3], SamplingParams(max_tokens=3))
    grammars.release()
    results = run(core)
    _, reasons, errors = results["bad"]
    assert reasons == [FinishReason.ERROR] * 2
    assert errors == [(ErrorKind.INVALID, "guided.regex does not compile: bad")] * 2
    assert results["free"][1] == [FinishReason.LENGTH]


def test_a_cached_bad_grammar_is_refused_at_admission() -> None:
    core = make_core()  # compiles finish at once, as cache hits do
    try:
        core.add("bad", [4, 5], guided("bad"))
    except ValueError as exc:
        assert "does not compile" in str(exc)
    else:
        raise AssertionError("a known-bad grammar was admitted")
    assert not core.has_unfinished


def test_an_abort_while_compiling_forgets_the_request() -> None:
    grammars = FakeGrammars(hold=True)
    core = make_core(grammars)
    core.add("guided", [4, 5], guided())
    assert core.abort("guided") and not core.has_unfinished
    grammars.release()
    assert core.step() == []


def test_a_rank_without_a_tokenizer_refuses_guided_requests_by_name() -> None:
    loaded = fake_loaded_rank(CONFIG)  # grammars=None
    core = EngineCore(MaskingExecutor(), loaded, CONFIG.scheduler)
    try:
        core.add("guided", [4, 5], guided())
    except ValueError as exc:
        assert "tokenizer" in str(exc)
    else:
        raise AssertionError("admitted without a grammar backend")


def test_rows_after_a_drafted_stop_token_are_never_filled_from_an_ended_grammar() -> None:
    grammar = SequenceGrammar(FixedMatcher([7], [STOP]))
    bitmask = np.zeros((3, 1), np.int32)
    grammar.fill(bitmask, 0, [7, STOP])  # FixedMatcher refuses a fill once ended
    assert [lowest_allowed(row) for row in bitmask] == [7, STOP, STOP]
    assert grammar.matcher.accepted == []
