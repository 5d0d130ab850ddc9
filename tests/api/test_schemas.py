"""Request bodies: a field we do not implement is refused by name, OpenAI's neutral values pass."""

from __future__ import annotations

import json

import pytest

from aioworker.api.errors import ApiError
from aioworker.api.schemas import decode_chat, decode_completion

COMPLETION = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refusal(decode, body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        decode(json.dumps(body).encode())
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**COMPLETION, "foo": 1}, "foo"),
        (
            {**COMPLETION, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
        ({**COMPLETION, "max_tokens": "ten"}, "max_tokens"),
        ({"prompt": "hi"}, "model"),
        ({**COMPLETION, "presence_penalty": 0.5}, "presence_penalty"),
        ({**COMPLETION, "logit_bias": {"5": 1.0}}, "logit_bias"),
        ({**COMPLETION, "best_of": 3}, "best_of"),
        ({**COMPLETION, "suffix": "end"}, "suffix"),
    ],
)
def test_completion_fields_we_do_not_serve_are_refused_by_name(body: dict, param: str) -> None:
    error = refusal(decode_completion, body)
    assert error.param == param and param.split(".")[-1] in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "tools": [{"type": "function"}]}, "tools"),
        ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
        ({**CHAT, "echo": True}, "echo"),
        (
            {**CHAT, "messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
        ),
        ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_chat_fields_we_do_not_serve_are_refused_by_name(body: dict, param: str) -> None:
    assert refusal(decode_chat, body).param == param


def test_neutral_values_of_unimplemented_fields_are_accepted() -> None:
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "user": "u1"}
    assert decode_completion(json.dumps({**COMPLETION, **neutral, "best_of": 1}).encode())
    chat = decode_chat(json.dumps({**CHAT, **neutral, "tool_choice": "none"}).encode())
    assert chat.messages[0].text == "hi"


def test_text_parts_are_joined_and_stop_may_be_one_string() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = decode_chat(
        json.dumps({**CHAT, "messages": [{"role": "user", "content": parts}], "stop": "x"}).encode()
    )
    assert body.messages[0].text == "ab" and body.stop_strings == ("x",)


def test_a_body_that_is_not_json_is_a_400() -> None:
    with pytest.raises(ApiError, match="not valid JSON"):
        decode_completion(b"{nope")
