"""Request body -> prompts: every prompt form, and the worker's checks made before sending (in
the vocabulary, not empty, no longer than max_model_len), each naming its field."""

from __future__ import annotations

import asyncio
import json

import pytest

from aioworker.api.errors import ApiError
from aioworker.api.prompts import chat_prompt, completion_prompts
from aioworker.api.schemas import decode_chat, decode_completion
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.checkpoint.tokenizer import Tokenizer

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def tokens(embedded_model_dir):
    tokenizer = Tokenizer(embedded_model_dir)
    tokens = PromptTokenizer(tokenizer, MAX_MODEL_LEN, tokenizer.vocab_size, 1)
    yield tokens
    tokens.close()


def completion(**fields):
    return decode_completion(json.dumps({"model": "m", **fields}).encode())


def chat(*contents: str):
    messages = [{"role": "user", "content": content} for content in contents]
    return decode_chat(json.dumps({"model": "m", "messages": messages}).encode())


def prompts(tokens, **fields):
    return asyncio.run(completion_prompts(completion(**fields), tokens))


def refused(coroutine) -> ApiError:
    with pytest.raises(ApiError) as caught:
        asyncio.run(coroutine)
    assert caught.value.status == 400
    return caught.value


def test_every_prompt_form(tokens) -> None:
    ids = tokens.tokenizer.encode("Hello there")
    assert [p.token_ids for p in prompts(tokens, prompt="Hello there")] == [ids]
    two = prompts(tokens, prompt=["Hello there", "Hi"])
    assert [p.text for p in two] == ["Hello there", "Hi"]
    assert prompts(tokens, prompt=[1, 2, 3])[0].token_ids == [1, 2, 3]
    assert [p.token_ids for p in prompts(tokens, prompt=[[1, 2], [3]])] == [[1, 2], [3]]


@pytest.mark.parametrize("prompt", [[], [1, "a"], [[1], "a"], [True, 2], ["a", [1]]])
def test_a_malformed_prompt_is_refused(tokens, prompt) -> None:
    error = refused(completion_prompts(completion(prompt=prompt), tokens))
    assert error.param == "prompt" and "prompt must be" in error.message


@pytest.mark.parametrize(
    ("prompt", "param", "message"),
    [
        (
            [1] * (MAX_MODEL_LEN + 1),
            "prompt",
            f"prompt has 65 tokens; max_model_len is {MAX_MODEL_LEN}",
        ),
        ([[1], [1] * 70], "prompt[1]", "prompt[1] has 70 tokens"),
        (["hi", " hello" * 70], "prompt[1]", "prompt[1] has 70 tokens"),
        ([[2], []], "prompt[1]", "prompt[1] is empty"),
        ([2**64], "prompt", "token id 18446744073709551616 at index 0, outside the vocabulary"),
        ([[1], [5, -1]], "prompt[1]", "token id -1 at index 1"),
    ],
)
def test_what_the_worker_would_refuse_is_refused_before_sending(tokens, prompt, param, message):
    error = refused(completion_prompts(completion(prompt=prompt), tokens))
    assert error.param == param and message in error.message


def test_a_text_prompt_longer_than_max_model_len_names_both_lengths(tokens) -> None:
    text = " hello" * 100  # about one token per word: fits the character cap, not the context
    error = refused(completion_prompts(completion(prompt=text), tokens))
    assert error.param == "prompt"
    assert error.message == f"prompt has 100 tokens; max_model_len is {MAX_MODEL_LEN}"


def test_chat_messages_go_through_the_template_and_are_checked_as_one_prompt(tokens) -> None:
    prompt = asyncio.run(chat_prompt(chat("hi"), tokens))
    assert prompt.token_ids == tokens.tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    error = refused(chat_prompt(chat("hi", " hello" * 60), tokens))
    assert error.param == "messages" and "max_model_len is 64" in error.message
    assert refused(chat_prompt(decode_chat(b'{"model": "m", "messages": []}'), tokens)).param == (
        "messages"
    )
