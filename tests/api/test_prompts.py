"""Request body -> prompts and SamplingParams: prompt forms, defaults, n and seeds, logprobs."""

from __future__ import annotations

import json

import pytest

from aioworker.api.errors import ApiError
from aioworker.api.prompts import (
    COMPLETION_MAX_TOKENS,
    chat_params,
    chat_prompt,
    completion_params,
    completion_prompts,
)
from aioworker.api.schemas import decode_chat, decode_completion
from aioworker.checkpoint.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir) -> Tokenizer:
    return Tokenizer(embedded_model_dir)


def completion(**fields):
    return decode_completion(json.dumps({"model": "m", **fields}).encode())


def chat(**fields):
    messages = [{"role": "user", "content": "hi"}]
    return decode_chat(json.dumps({"model": "m", "messages": messages, **fields}).encode())


def test_every_prompt_form(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hello there")
    assert [
        p.token_ids for p in completion_prompts(completion(prompt="Hello there"), tokenizer)
    ] == [ids]
    two = completion_prompts(completion(prompt=["Hello there", "Hi"]), tokenizer)
    assert [p.text for p in two] == ["Hello there", "Hi"]
    assert completion_prompts(completion(prompt=[1, 2, 3]), tokenizer)[0].token_ids == [1, 2, 3]
    lists = completion_prompts(completion(prompt=[[1, 2], [3]]), tokenizer)
    assert [p.token_ids for p in lists] == [[1, 2], [3]]


@pytest.mark.parametrize("prompt", [[], [1, "a"], [[1], "a"], [True, 2], [[]] * 0])
def test_a_malformed_prompt_is_refused(tokenizer: Tokenizer, prompt) -> None:
    with pytest.raises(ApiError, match="prompt must be") as caught:
        completion_prompts(completion(prompt=prompt), tokenizer)
    assert caught.value.param == "prompt"


def test_completion_defaults_and_echo_asks_for_prompt_logprobs() -> None:
    params = completion_params(completion(prompt="x"))
    assert params.max_tokens == COMPLETION_MAX_TOKENS and params.temperature == 1.0
    assert params.logprobs is None and params.prompt_logprobs is None
    echoed = completion_params(completion(prompt="x", echo=True, logprobs=3, top_k=-1))
    assert (echoed.logprobs, echoed.prompt_logprobs, echoed.top_k) == (3, 3, 0)


def test_chat_fills_the_context_by_default_and_prefers_max_completion_tokens(tokenizer) -> None:
    body = chat()
    prompt = chat_prompt(body, tokenizer)
    assert chat_params(body, prompt, 100).max_tokens == 100 - len(prompt.token_ids)
    both = chat(max_tokens=50, max_completion_tokens=7)
    assert chat_params(both, prompt, 100).max_tokens == 7
    with pytest.raises(ApiError, match="leaving none"):
        chat_params(body, prompt, len(prompt.token_ids))


def test_chat_logprobs(tokenizer: Tokenizer) -> None:
    prompt = chat_prompt(chat(), tokenizer)
    body = chat(logprobs=True, top_logprobs=5, max_tokens=3)
    assert chat_params(body, prompt, 100).logprobs == 5
    assert chat_params(chat(logprobs=True, max_tokens=3), prompt, 100).logprobs == 0
    with pytest.raises(ApiError, match="top_logprobs needs logprobs"):
        chat_params(chat(top_logprobs=2, max_tokens=3), prompt, 100)


def test_limits_are_named() -> None:
    for fields, param in [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": ["x"] * 17}, "stop"),
    ]:
        with pytest.raises(ApiError) as caught:
            completion_params(completion(prompt="x", **fields))
        assert caught.value.param == param and caught.value.status == 400


def test_n_is_the_samples_of_one_request() -> None:
    assert completion_params(completion(prompt="x", n=4, seed=10)).n == 4
    with pytest.raises(ApiError, match="n is 65") as caught:
        completion_params(completion(prompt="x", n=65))
    assert caught.value.param == "n"
