"""Chat answers with tool calls, whole and streamed: OpenAI's message (content null, tool_calls
with JSON-text arguments) and finish_reason "tool_calls"; a stream holds a call back, then sends
its id and name, then its arguments, and ends with the same finish_reason."""

from __future__ import annotations

import json

import pytest

from aioworker.api.choices import Choice
from aioworker.api.logprob_format import TokenTexts
from aioworker.api.prompts import Prompt
from aioworker.api.shapes import ChatShape
from aioworker.api.tool_calls import HermesParser
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.outputs import FinishReason, RequestOutput

CALL = {"name": "get_weather", "arguments": {"city": "Oslo"}}
TEXT = f"Checking.<tool_call>\n{json.dumps(CALL)}\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    return Tokenizer(embedded_model_dir)


def outputs(tokenizer, text: str, reason: FinishReason) -> list[RequestOutput]:
    """The text's tokens one output each, the last ending the request."""
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    return [
        RequestOutput("r", [t], reason if i == len(token_ids) - 1 else None)
        for i, t in enumerate(token_ids)
    ]


def whole(tokenizer, text: str, reason: FinishReason = FinishReason.STOP) -> dict:
    choice = Choice(0, Prompt([1]), tokenizer, ())
    for out in outputs(tokenizer, text, reason):
        choice.add(out)
    return ChatShape(TokenTexts(tokenizer), HermesParser).full_choice(choice)


def streamed(tokenizer, text: str) -> list[dict]:
    shape = ChatShape(TokenTexts(tokenizer), HermesParser)
    choice = Choice(0, Prompt([1]), tokenizer, ())
    bodies = []
    for out in outputs(tokenizer, text, FinishReason.STOP):
        delta = choice.add(out)
        bodies += shape.chunk_choices(choice, delta, out, False)
    return bodies


def test_a_whole_answer_carries_the_calls_and_finish_reason_tool_calls(tokenizer) -> None:
    answer = whole(tokenizer, TEXT)
    message = answer["message"]
    assert answer["finish_reason"] == "tool_calls" and message["content"] == "Checking."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == CALL["arguments"]


def test_an_answer_without_calls_is_plain_content(tokenizer) -> None:
    answer = whole(tokenizer, "It is sunny.")
    assert answer["message"] == {"role": "assistant", "content": "It is sunny."}
    assert answer["finish_reason"] == "stop"


def test_a_call_cut_short_by_max_tokens_is_content_with_finish_reason_length(tokenizer) -> None:
    answer = whole(tokenizer, TEXT[:-20], FinishReason.LENGTH)
    assert answer["message"]["content"] == TEXT[:-20] and answer["finish_reason"] == "length"


def test_a_stream_holds_the_call_back_then_sends_name_then_arguments(tokenizer) -> None:
    bodies = streamed(tokenizer, TEXT)
    deltas = [body["delta"] for body in bodies]
    content = "".join(d.get("content", "") for d in deltas)
    assert content == "Checking."
    head, arguments = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert arguments == {"index": 0, "function": {"arguments": json.dumps(CALL["arguments"])}}
    assert [b["finish_reason"] for b in bodies][-1] == "tool_calls"
    assert all(b["finish_reason"] is None for b in bodies[:-1])
    # Tokens inside the call made no chunks of their own.
    assert len(bodies) < len(tokenizer.encode(TEXT, add_special_tokens=False))
