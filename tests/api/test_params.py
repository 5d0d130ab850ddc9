"""Request body -> SamplingParams: defaults, n and seeds, logprobs, the sampling controls users
send (mapped to the right fields), the constraint on the output, and every refusal naming the
field as the client wrote it."""

from __future__ import annotations

import asyncio
import json

import pytest

from aioworker.api.errors import ApiError
from aioworker.api.guidance import request_guidance
from aioworker.api.params import COMPLETION_MAX_TOKENS, chat_params, completion_params
from aioworker.api.prompts import Prompt
from aioworker.api.schemas import decode_chat, decode_completion
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.guided import GuidedParams


@pytest.fixture(scope="module")
def tokens(embedded_model_dir):
    tokenizer = Tokenizer(embedded_model_dir)
    tokens = PromptTokenizer(tokenizer, 100, tokenizer.vocab_size, 1)
    yield tokens
    tokens.close()


def completion(tokens, **fields):
    body = decode_completion(json.dumps({"model": "m", "prompt": "x", **fields}).encode())
    return asyncio.run(completion_params(body, tokens))


def chat(tokens, prompt: Prompt, **fields):
    messages = [{"role": "user", "content": "hi"}]
    body = decode_chat(json.dumps({"model": "m", "messages": messages, **fields}).encode())
    return asyncio.run(chat_params(body, prompt, tokens))


def refusal(make, *args, **fields) -> ApiError:
    with pytest.raises(ApiError) as caught:
        make(*args, **fields)
    assert caught.value.status == 400
    return caught.value


def test_completion_defaults_and_echo_asks_for_prompt_logprobs(tokens) -> None:
    params = completion(tokens)
    assert params.max_tokens == COMPLETION_MAX_TOKENS and params.temperature == 1.0
    assert params.logprobs is None and params.prompt_logprobs is None
    echoed = completion(tokens, echo=True, logprobs=3, top_k=-1)
    assert (echoed.logprobs, echoed.prompt_logprobs, echoed.top_k) == (3, 3, 0)


def test_chat_fills_the_context_by_default_and_prefers_max_completion_tokens(tokens) -> None:
    prompt = Prompt([1] * 10)
    assert chat(tokens, prompt).max_tokens == 90
    assert chat(tokens, prompt, max_tokens=50, max_completion_tokens=7).max_tokens == 7
    assert "leaving none" in refusal(chat, tokens, Prompt([1] * 100)).message


def test_max_tokens_beyond_the_context_is_sent_as_the_worker_takes_it(tokens) -> None:
    """The worker ends such a request with "length" at max_model_len; so does the gateway."""
    assert completion(tokens, max_tokens=10**6).max_tokens == 10**6


def test_chat_logprobs_and_top_logprobs_is_named(tokens) -> None:
    prompt = Prompt([1])
    assert chat(tokens, prompt, logprobs=True, top_logprobs=5, max_tokens=3).logprobs == 5
    assert chat(tokens, prompt, logprobs=True, max_tokens=3).logprobs == 0
    error = refusal(chat, tokens, prompt, top_logprobs=2, max_tokens=3)
    assert error.param == "top_logprobs" and "needs logprobs" in error.message
    error = refusal(chat, tokens, prompt, logprobs=True, top_logprobs=25)
    assert error.param == "top_logprobs" and error.message.startswith("top_logprobs is 25")


def test_max_completion_tokens_is_named_as_given(tokens) -> None:
    error = refusal(chat, tokens, Prompt([1]), max_completion_tokens=-3)
    assert error.param == "max_completion_tokens"


def test_the_sampling_controls_map_to_sampling_params(tokens) -> None:
    params = completion(
        tokens,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        min_p=0.05,
        logit_bias={"17": -100, "42": 2.5},
        allowed_token_ids=[17, 42, 99],
        seed=-1,
    )
    assert (params.repetition_penalty, params.presence_penalty) == (1.2, 0.5)
    assert (params.frequency_penalty, params.min_p) == (-0.25, 0.05)
    assert params.logit_bias == {17: -100.0, 42: 2.5}
    assert params.allowed_token_ids == (17, 42, 99) and params.seed is None
    neutral = completion(tokens, repetition_penalty=1.0)  # what `vllm bench serve` sends
    assert neutral == completion(tokens)  # the same request as one that sends no penalty


def test_bad_words_are_tokenized_as_given_and_after_a_space(tokens) -> None:
    params = completion(tokens, bad_words=["hello", " world"])
    encode = tokens.tokenizer.encode
    expected = {
        tuple(encode("hello", add_special_tokens=False)),
        tuple(encode(" hello", add_special_tokens=False)),
        tuple(encode(" world", add_special_tokens=False)),
    }
    assert set(params.bad_words_token_ids) == expected and len(params.bad_words_token_ids) == 3


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": 0}, "max_tokens", "max_tokens is 0"),
        ({"temperature": -1}, "temperature", "temperature is -1"),
        ({"logprobs": 21}, "logprobs", "logprobs is 21"),
        ({"stop": ["x"] * 17}, "stop", "stop has 17"),
        ({"n": 65}, "n", "n is 65"),
        ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty is 0"),
        ({"presence_penalty": 2.5}, "presence_penalty", "between -2 and 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty is -3"),
        ({"min_p": 1.5}, "min_p", "min_p is 1.5"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100"),
        ({"logit_bias": {"five": 1}}, "logit_bias", "'five', which is not a token id"),
        ({"logit_bias": {str(2**64): 1}}, "logit_bias", "token id 18446744073709551616"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "allowed_token_ids has 0 ids"),
        ({"allowed_token_ids": [10**9]}, "allowed_token_ids", "outside the vocabulary"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "token id -1"),
        ({"bad_words": [""]}, "bad_words[0]", "bad_words[0] is empty"),
        ({"bad_words": ["x"] * 129}, "bad_words", "bad_words has 129 entries"),
        ({"bad_words": ["word " * 40]}, "bad_words[0]", "bad_words[0] has 41 tokens"),
        ({"bad_words": ["w" * 5000]}, "bad_words[0]", "more than 16 tokens"),
        ({"seed": -2}, "seed", "seed is -2"),
    ],
)
def test_out_of_range_values_are_named(tokens, fields, param, message) -> None:
    error = refusal(completion, tokens, **fields)
    assert error.param == param and message in error.message, error.message


def guided(tokens, decode, **fields):
    base = {"model": "m"}
    if decode is decode_chat:
        base["messages"] = [{"role": "user", "content": "hi"}]
        body = decode_chat(json.dumps({**base, **fields}).encode())
        return asyncio.run(chat_params(body, Prompt([1]), tokens, request_guidance(body)))
    body = decode_completion(json.dumps({**base, "prompt": "x", **fields}).encode())
    return asyncio.run(completion_params(body, tokens, request_guidance(body)))


@pytest.mark.parametrize("decode", [decode_chat, decode_completion])
def test_the_constraint_travels_in_sampling_params(tokens, decode) -> None:
    params = guided(tokens, decode, guided_regex=r"\d+", max_tokens=5)
    assert params.guided == GuidedParams(regex=r"\d+")
    assert guided(tokens, decode, max_tokens=5).guided is None


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"guided_choice": []}, "guided_choice", "guided_choice has 0 entries"),
        ({"guided_choice": ["x" * 2000]}, "guided_choice", "guided_choice entry"),
        ({"guided_regex": "a" * 70000}, "guided_regex", "guided_regex has 70000 characters"),
    ],
)
def test_a_bad_constraint_is_named_as_the_client_wrote_it(tokens, fields, param, message) -> None:
    error = refusal(guided, tokens, decode_chat, **fields)
    assert error.param == param and error.message.startswith(message), error.message
