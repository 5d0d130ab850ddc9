"""What a request may ask for: a bad value is refused naming the field and its limit; a
temperature too small to divide by samples greedily; bad words given as text."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from aioworker.core.admission import RequestValidator
from aioworker.core.block_manager import BlockManager
from aioworker.core.sampling_params import (
    GREEDY_BELOW,
    InvalidRequestError,
    SamplingParams,
    bad_words_token_ids,
)
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence


@pytest.mark.parametrize("temperature", [math.inf, -math.inf, math.nan, -0.5])
def test_a_temperature_that_is_not_finite_and_non_negative_is_refused(temperature) -> None:
    with pytest.raises(InvalidRequestError, match="temperature is .*; it must be finite and >= 0"):
        SamplingParams(temperature=temperature).validate()


def test_unknown_fields_are_refused_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `max_token`"):
        msgspec.convert({"max_token": 5}, SamplingParams)


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, GREEDY_BELOW / 2])
def test_a_temperature_below_the_bound_is_scheduled_as_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    params.validate()
    scheduler = Scheduler(BlockManager(4, 4), 4, 64, 16)
    scheduler.add(Sequence(0, "r", [1, 2], params))
    [new_seq] = scheduler.schedule().new_seqs
    assert params.is_greedy and new_seq.sampling.temperature == 0.0


def test_a_temperature_at_the_bound_is_sampled_as_asked() -> None:
    scheduler = Scheduler(BlockManager(4, 4), 4, 64, 16)
    scheduler.add(Sequence(0, "r", [1, 2], SamplingParams(temperature=GREEDY_BELOW)))
    [new_seq] = scheduler.schedule().new_seqs
    assert new_seq.sampling.temperature == GREEDY_BELOW


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty is 0.0; it must be finite and > 0"),
        ({"presence_penalty": 2.5}, "presence_penalty is 2.5; it must be between -2 and 2"),
        ({"frequency_penalty": -3.0}, "frequency_penalty is -3.0; it must be between -2 and 2"),
        ({"min_p": 1.5}, r"min_p is 1.5; it must be in \[0, 1\]"),
        ({"logit_bias": {5: 101.0}}, "logit_bias for token 5 is 101.0"),
        ({"allowed_token_ids": ()}, "allowed_token_ids has 0 ids"),
        ({"bad_words_token_ids": ((),)}, "a bad word has 0 tokens"),
        ({"bad_words_token_ids": (tuple(range(17)),)}, "a bad word has 17 tokens"),
        (
            {"allowed_token_ids": (3, 4), "bad_words_token_ids": ((4,), (3,), (3, 5))},
            "every token of allowed_token_ids is also a bad word",
        ),
    ],
)
def test_a_bad_logit_control_is_refused_naming_it(fields: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**fields).validate()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"logit_bias": {40000: 1.0}}, "logit_bias holds 40000"),
        ({"allowed_token_ids": (1, -1)}, "allowed_token_ids holds -1"),
        ({"bad_words_token_ids": ((1, 32000),)}, "bad_words holds 32000"),
    ],
)
def test_token_ids_of_the_controls_are_checked_against_the_vocabulary(
    fields: dict, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message + r"; token ids must be in \[0, 32000\)"):
        RequestValidator(32000, 64).check([1, 2], SamplingParams(**fields))


def test_bad_words_as_text_are_tokenized_as_written_and_after_a_space() -> None:
    vocabulary = {"York": [7], " York": [9], "New York": [3, 7], " New York": [5, 9]}
    words = bad_words_token_ids(vocabulary.__getitem__, ["York", "New York"])
    assert words == ((7,), (9,), (3, 7), (5, 9))
    same = bad_words_token_ids(lambda text: [1, 2], ["a"])  # one entry when both spell the same
    assert same == ((1, 2),)
    with pytest.raises(InvalidRequestError, match="a bad word is empty"):
        bad_words_token_ids(vocabulary.__getitem__, [" "])


def test_guided_names_what_is_wrong_with_it() -> None:
    from aioworker.core.guided import GuidedParams

    cases = {
        GuidedParams(): "give exactly one of",
        GuidedParams(regex="a", choice=("x",)): "guided gives regex, choice",
        GuidedParams(json_schema="{not json"): "guided.json_schema is not valid JSON",
        GuidedParams(json_schema="[1]"): "must be a JSON object",
        GuidedParams(choice=()): "guided.choice has 0 entries",
        GuidedParams(regex="a" * 70000): "at most 65536",
    }
    for guided, message in cases.items():
        with pytest.raises(InvalidRequestError, match=message):
            SamplingParams(guided=guided).validate()


def test_guided_keys_name_what_is_asked_for() -> None:
    from aioworker.core.guided import GuidedParams

    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    assert GuidedParams(json_schema=schema).key == GuidedParams(json_schema=json.dumps(schema)).key
    reordered = {"type": "object", "properties": {"a": {}, "b": {}}}  # generated in that order
    assert GuidedParams(json_schema=schema).key != GuidedParams(json_schema=reordered).key
    assert GuidedParams(regex="a").key != GuidedParams(grammar="a").key
    compact = GuidedParams(json_object=True, compact_json=True)
    assert compact.key != GuidedParams(json_object=True).key
