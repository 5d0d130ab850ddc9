"""GPU tests of the logit controls (`pytest -m gpu`), on a tiny random Llama in float32 through
the CUDA runner with graphs on and the one-pass draw: greedy tokens under repetition_penalty, bad
words and presence/frequency follow transformers' processors (or OpenAI's rule) over the model's
own logits at every position; penalties count the token still in flight when the next step is
launched (the runner's run-ahead); the same tokens through preemption and the prefix cache; the
device state equals the CPU's."""

from __future__ import annotations

import msgspec
import pytest
import torch
from transformers.generation.logits_process import (
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from aioworker.compute.sampling.controls import SamplingControls
from aioworker.core.plan import PENDING_TOKEN
from tests.compute.sampling.test_controls import every_control, output_ids, random_logits
from tests.conftest import make_engine
from tests.test_sampling_controls import (
    CONTROLLED,
    GREEDY,
    check_a_cached_prompt_is_penalised,
    check_samples_equal_requests_with_consecutive_seeds,
    cramped_engine,
    prompts,
    tokens,
)
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.gpu

SETTINGS = {
    "device.kind": "cuda",
    "model.dtype": "float32",
    "cache.num_blocks": 256,
    "model.max_model_len": 256,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    reference = build_tiny_model("llama", path, logit_scale=4.0).cuda()
    engine = make_engine(path, **SETTINGS)
    assert engine.executor.runner.graphs is not None
    yield path, reference, engine
    engine.close()


# float32 logits of two implementations differ in the last bits: where the reference's two
# best tokens are this close, either is a right greedy choice.
NEAR_TIE = 1e-4


def assert_greedy_under(reference, prompt: list[int], outputs: list[int], process) -> None:
    """Each output is the argmax of the reference's logits before it (teacher-forced with our
    outputs, so one near-tie cannot derail the rest) after `process(outputs before, row)`."""
    with torch.no_grad():
        ids = torch.tensor([prompt + outputs], device=reference.device)
        logits = reference(ids).logits[0, len(prompt) - 1 : -1].float().cpu()
    for i, token in enumerate(outputs):
        row = process(outputs[:i], logits[i].clone())
        best, second = row.topk(2).values.tolist()
        assert token == row.argmax().item() or best - second <= NEAR_TIE * abs(best), i


def test_greedy_controls_through_cuda_graphs_follow_transformers(tiny) -> None:
    """repetition_penalty (RepetitionPenaltyLogitsProcessor over prompt and outputs) and bad
    words (NoBadWordsLogitsProcessor over the outputs), at every position."""
    _, reference, engine = tiny
    graphs = engine.executor.runner.graphs
    runs_before = graphs.num_runs
    batch = prompts(4)
    params = msgspec.structs.replace(GREEDY, repetition_penalty=1.4)
    for prompt, outputs in zip(batch, tokens(engine, batch, params), strict=True):
        penalty = RepetitionPenaltyLogitsProcessor(1.4)

        def repeat(before, row, prompt=prompt, penalty=penalty):
            return penalty(torch.tensor([prompt + before]), row[None])[0]

        assert_greedy_under(reference, prompt, outputs, repeat)
    prompt = prompts(1, seed=3)[0]
    free = tokens(engine, [prompt], GREEDY)[0]
    words = [free[2:4], free[6:9], [free[12]]]
    banned = msgspec.structs.replace(GREEDY, bad_words_token_ids=tuple(map(tuple, words)))
    [outputs] = tokens(engine, [prompt], banned)
    ban = NoBadWordsLogitsProcessor(words, eos_token_id=None)
    assert_greedy_under(
        reference, prompt, outputs, lambda before, row: ban(output_ids(before), row[None])[0]
    )
    assert outputs != free and free[12] not in outputs
    assert graphs.num_runs > runs_before + 40  # the decode steps replayed graphs


def test_penalties_count_the_token_still_in_flight(tiny) -> None:
    """Steps are launched with PENDING_TOKEN inputs (the token the step before samples, still
    on the device); each step's penalties must already count it: greedy tokens follow the
    plain reference over every output before them."""
    _, reference, engine = tiny
    plans = []
    submit = engine.core.executor.submit
    engine.core.executor.submit = lambda plan: (plans.append(plan), submit(plan))[1]
    try:
        batch = prompts(3, seed=4)
        params = msgspec.structs.replace(GREEDY, presence_penalty=0.7, frequency_penalty=1.5)
        got = tokens(engine, batch, params)
    finally:
        engine.core.executor.submit = submit
    assert sum(PENDING_TOKEN in plan.input_token_ids for plan in plans) >= 20

    def openai(before, row):
        for token in set(before):
            row[token] -= 0.7 + 1.5 * before.count(token)
        return row

    for prompt, outputs in zip(batch, got, strict=True):
        assert_greedy_under(reference, prompt, outputs, openai)
    assert got != tokens(engine, batch, GREEDY)


def test_controls_survive_preemption_chunking_and_the_prefix_cache(tiny) -> None:
    path, _, roomy = tiny
    batch = prompts(16, seed=5)
    params = [CONTROLLED[i % 4] for i in range(16)]
    expected = tokens(roomy, batch, params)
    small = cramped_engine(path, SETTINGS)
    try:
        assert tokens(small, batch, params) == expected
        assert small.scheduler.num_preemptions > 0
    finally:
        small.close()
    assert check_a_cached_prompt_is_penalised(path, roomy, SETTINGS) > 0


def test_the_one_pass_draw_keeps_to_the_controls(tiny) -> None:
    _, _, engine = tiny
    check_samples_equal_requests_with_consecutive_seeds(engine)
    restricted = CONTROLLED[2]
    for outputs in tokens(engine, prompts(4, seed=9), restricted):
        assert all(t % 3 == 0 and t != 9 for t in outputs)
        assert (7, 8) not in zip(outputs, outputs[1:], strict=False)


def test_the_device_state_equals_the_cpus() -> None:
    """Every control, admitted with history and run for a few steps, on CUDA and on the CPU."""
    results = []
    for device in (torch.device("cuda"), torch.device("cpu")):
        state = SamplingControls(device, 96)
        state.admit(every_control(0, list(range(10)), [2, 4, 4, 10]))
        logits = random_logits(3, seed=1).to(device)
        for token in (12, 14, 6):
            step = state.for_step([1, 0, 2])
            step.process_logits(logits)
            step.record(torch.tensor([0, token, 0], device=device))
        results.append(logits.cpu())
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)
