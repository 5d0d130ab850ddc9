"""Guided decoding end to end on the embedded model: sampled outputs that always parse and validate,
regexes, a grammar and a choice that always match, unguided rows untouched by guided ones, and
guidance composing with preemption, speculation, prefix caching, parallel samples, logprobs and
stop strings."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import msgspec
import pytest

from aioworker.core.guided import GuidedParams
from aioworker.core.outputs import ErrorKind, FinishReason
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import WeightsPhase
from tests.conftest import make_engine
from tests.guided_schemas import PERSON, PROMPTS, SCHEMAS

pytestmark = pytest.mark.slow

# Bounded, so that every sampled output can end within its tokens.
ARITHMETIC = """
root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= factor (("*" | "/") factor){0,2}
factor ::= num | "(" num ("+" | "-") num ")"
num ::= [1-9] [0-9]{0,2}
"""
_NUM = r"[1-9][0-9]{0,2}"
_FACTOR = rf"({_NUM}|\({_NUM}[+-]{_NUM}\))"
_TERM = rf"{_FACTOR}([*/]{_FACTOR}){{0,2}}"
ARITHMETIC_TEXT = rf"{_TERM}([+-]{_TERM}){{0,3}}"  # the grammar above, as a regex
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
EMAIL = r"[a-z]{1,12}(\.[a-z]{1,8})?@[a-z]{2,10}\.(com|org|net)"
COLOURS = ("red", "green", "blue", "yellow", "purple")
COPY_JSON = '{"city": "Lyon", "country": "France", "population": 522250, "river": "Rhone"}'
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
        "river": {"type": "string"},
    },
    "required": ["city", "country", "population", "river"],
}


@pytest.fixture(scope="module")
def engine(embedded_model_dir):
    # Room for 60 sampled JSON outputs at once.
    engine = make_engine(embedded_model_dir, **{"cache.num_blocks": 1536})
    yield engine
    engine.close()


def sampled(schema_or_guided, count: int, max_tokens: int = 200) -> list[SamplingParams]:
    guided = (
        schema_or_guided
        if isinstance(schema_or_guided, GuidedParams)
        else GuidedParams(json_schema=schema_or_guided)
    )
    return [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, guided=guided)
        for seed in range(count)
    ]


def greedy(guided: GuidedParams | None, max_tokens: int = 64, **fields) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, guided=guided, **fields)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_sixty_sampled_outputs_parse_and_validate(engine, name: str) -> None:
    schema = SCHEMAS[name]
    prompts = [engine.encode(prompt, chat=True) for prompt in PROMPTS]
    completions = engine.generate(prompts, sampled(schema, len(prompts)))
    for completion in completions:
        assert completion.finish_reason is FinishReason.STOP, completion.text
        jsonschema.validate(json.loads(completion.text), schema)
    assert len({c.text for c in completions}) > len(completions) // 2  # sampled, not one answer


def test_regexes_a_grammar_and_a_choice_always_match(engine) -> None:
    cases = [
        ("When was the moon landing? Give the date.", GuidedParams(regex=DATE), DATE),
        ("Write an e-mail address for a baker.", GuidedParams(regex=EMAIL), EMAIL),
        ("Write a sum of numbers.", GuidedParams(grammar=ARITHMETIC), None),
        ("Name a colour.", GuidedParams(choice=COLOURS), None),
    ]
    for prompt, guided, pattern in cases:
        completions = engine.generate(
            [engine.encode(prompt, chat=True)] * 8, sampled(guided, 8, max_tokens=48)
        )
        for completion in completions:
            assert completion.finish_reason is FinishReason.STOP, (prompt, completion.text)
            text = completion.text
            if pattern is not None:
                assert re.fullmatch(pattern, text), (prompt, text)
            elif guided.choice:
                assert text in COLOURS
            else:
                assert re.fullmatch(ARITHMETIC_TEXT, text), text


def test_unguided_rows_equal_the_same_requests_alone(engine) -> None:
    prompts = [engine.encode(p, chat=True) for p in PROMPTS[:4]]
    free = greedy(None, max_tokens=24, ignore_eos=True)
    params = [
        free,
        greedy(GuidedParams(json_schema=PERSON)),
        free,
        greedy(GuidedParams(regex=DATE)),
    ]
    together = engine.generate(prompts, params)
    for index in (0, 2):
        [alone] = engine.generate([prompts[index]], free)
        assert together[index].token_ids == alone.token_ids


def test_a_preempted_guided_output_equals_the_unpreempted_one(engine, embedded_model_dir) -> None:
    prompts = [engine.encode(p, chat=True) for p in PROMPTS[:6]]
    params = greedy(GuidedParams(json_schema=PERSON), max_tokens=120)
    expected = engine.generate(prompts, params)
    # 6 sequences of ~40 prompt + ~50 output tokens in 20 blocks of 16: some are preempted.
    small_cache = {"cache.num_blocks": 20, "model.max_model_len": 256}
    with make_engine(embedded_model_dir, **small_cache) as small:
        got = small.generate(prompts, params)
        assert small.scheduler.num_preemptions > 0
    assert [c.text for c in got] == [c.text for c in expected]
    for completion in got:
        jsonschema.validate(json.loads(completion.text), PERSON)


@pytest.mark.parametrize(
    "speculative",
    [
        {"speculative.method": "ngram"},
        {"speculative.method": "draft", "speculative.draft_layers": 24},
    ],
    ids=["ngram", "self-draft"],
)
def test_guided_speculation_equals_guidance_alone(engine, embedded_model_dir, speculative) -> None:
    prompt = engine.encode(f"Repeat this JSON exactly: {COPY_JSON}", chat=True)
    params = [
        greedy(GuidedParams(json_schema=CITY), max_tokens=64),
        greedy(GuidedParams(json_schema=CITY, compact_json=True), max_tokens=64),
        greedy(GuidedParams(regex=r"[A-Za-z ,.]{1,80}"), max_tokens=32),
    ]
    expected = engine.generate([prompt] * 3, params)
    settings = {**speculative, "speculative.num_tokens": 4, "speculative.dynamic": False}
    with make_engine(embedded_model_dir, **settings) as speculating:
        got = speculating.generate([prompt] * 3, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert sum(c.num_accepted_tokens for c in got) > 0  # drafts were kept, not only refused
    jsonschema.validate(json.loads(got[0].text), CITY)


def test_a_prefix_cache_hit_and_parallel_samples_keep_to_the_grammar(engine) -> None:
    prompt = engine.encode(PROMPTS[0], chat=True)
    guided = GuidedParams(json_schema=PERSON)
    [first] = engine.generate([prompt], greedy(guided, max_tokens=120))
    hits_before = engine.block_manager.num_hit_tokens
    [again] = engine.generate([prompt], greedy(guided, max_tokens=120))
    assert engine.block_manager.num_hit_tokens > hits_before
    assert again.token_ids == first.token_ids
    samples = engine.generate([prompt], SamplingParams(max_tokens=200, n=4, seed=3, guided=guided))
    assert len(samples) == 4 and len({s.text for s in samples}) > 1
    for sample in samples:
        jsonschema.validate(json.loads(sample.text), PERSON)


def test_logprobs_are_those_of_the_masked_distribution(engine) -> None:
    prompt = engine.encode("Is water wet? Answer yes or no.", chat=True)
    [completion] = engine.generate(
        [prompt], greedy(GuidedParams(choice=("yes", "no")), max_tokens=4, logprobs=5)
    )
    first = completion.logprobs[0]
    finite = [
        (token_id, logprob)
        for token_id, logprob in zip(first.top_token_ids, first.top_logprobs, strict=True)
        if math.isfinite(logprob)
    ]
    # Every alternative with any probability starts "yes" or "no", and together they hold
    # nearly all of it: the distribution is the masked one, renormalised.
    for token_id, _ in finite:
        text = engine.tokenizer.decode([token_id])
        assert "yes".startswith(text) or "no".startswith(text), text
    assert sum(math.exp(logprob) for _, logprob in finite) > 0.9


def test_a_stop_string_ends_a_guided_output_early(engine) -> None:
    prompt = engine.encode(PROMPTS[1], chat=True)
    guided = GuidedParams(json_schema=PERSON)
    [whole] = engine.generate([prompt], greedy(guided, max_tokens=120))
    [cut] = engine.generate([prompt], greedy(guided, max_tokens=120, stop=('"age"',)))
    assert cut.finish_reason is FinishReason.STOP and '"age"' not in cut.text
    assert whole.text.startswith(cut.text)


def test_a_bad_schema_fails_its_request_and_the_batch_finishes(engine) -> None:
    prompts = [engine.encode(p, chat=True) for p in PROMPTS[:3]]
    bad = greedy(GuidedParams(json_schema={"type": "object", "properties": {"a": {"type": 5}}}))
    good = greedy(GuidedParams(regex=DATE))
    free = msgspec.structs.replace(greedy(None, max_tokens=8), ignore_eos=True)
    completions = engine.generate(prompts, [good, bad, free])
    assert completions[1].finish_reason is FinishReason.ERROR
    assert completions[1].error_kind is ErrorKind.INVALID
    assert "guided.json_schema does not compile" in completions[1].error
    assert re.fullmatch(DATE, completions[0].text)
    assert completions[2].finish_reason is FinishReason.LENGTH


def test_a_weights_update_between_steps_keeps_each_matcher_where_it_was(
    engine, embedded_model_dir
) -> None:
    """As the runtime does: the steps in flight complete (each one's masks come as the step
    before it completes), the update runs, and guided outputs carry on from where they were."""
    prompts = [engine.encode(p, chat=True) for p in PROMPTS[:3]]
    params = greedy(GuidedParams(json_schema=PERSON), max_tokens=120)
    expected = [c.token_ids for c in engine.generate(prompts, params)]
    request_ids = [engine.add_request(prompt, params) for prompt in prompts]
    tokens: dict[str, list[int]] = {request_id: [] for request_id in request_ids}
    outputs = [out for _ in range(6) for out in engine.step()]
    core = engine.core
    while core.in_flight:  # complete without launching more
        outputs += core.complete(core.in_flight[0].future.result())
    run_phase(engine, "stage", path=str(embedded_model_dir))
    run_phase(engine, "commit")
    core.reset_prefix_cache()
    while engine.has_unfinished:
        outputs += engine.step()
    for out in outputs:
        tokens[out.request_id] += out.token_ids
    assert [tokens[request_id] for request_id in request_ids] == expected


def run_phase(engine, op: str, **fields) -> int:
    return engine.executor.run_weights_phase(WeightsPhase(op=op, **fields)).result()


def test_a_prompt_prefilled_in_chunks_keeps_to_the_grammar(engine) -> None:
    """A prompt longer than a CPU step's 256-token budget is computed over several steps; only
    its last chunk samples, and only that step waits for a mask."""
    paragraph = " ".join(PROMPTS) * 3
    prompt = engine.encode(f"{paragraph}\n\nNow describe one of these people as JSON.", chat=True)
    assert len(prompt) > 2 * 256
    first_step = engine.core.last_step_id
    # Compact: after so long a prompt the model drifts into whitespace runs, which the grammar
    # allows and the token budget then cuts short.
    guided = GuidedParams(json_schema=PERSON, compact_json=True)
    [completion] = engine.generate([prompt], greedy(guided, 120))
    assert engine.core.last_step_id - first_step > len(completion.token_ids) + 1  # chunks
    assert completion.finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(completion.text), PERSON)
