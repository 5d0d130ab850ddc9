"""Request bodies: a field we do not implement is refused by name, OpenAI's neutral values pass,
and a number too big for the wire or a body nested too deeply is a 400, not a 500."""

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
        ({**COMPLETION, "stream_options": {"chunk_size": 3}}, "stream_options.chunk_size"),
        ({**COMPLETION, "max_tokens": "ten"}, "max_tokens"),
        ({"prompt": "hi"}, "model"),
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
        ({**CHAT, "tools": [{"type": "function"}]}, "tools[0].function"),
        ({**CHAT, "tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0].type"),
        ({**CHAT, "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
        ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({**CHAT, "tool_choice": "sometimes"}, "tool_choice"),
        ({**CHAT, "tool_choice": {"type": "function"}}, "tool_choice.function"),
        ({**CHAT, "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
        ({**CHAT, "guided_choice": "yes"}, "guided_choice"),
        ({**CHAT, "echo": True}, "echo"),
        (
            {**CHAT, "messages": [{"role": "user", "content": "x", "audio": {}}]},
            "messages[0].audio",
        ),
        ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_chat_fields_we_do_not_serve_are_refused_by_name(body: dict, param: str) -> None:
    assert refusal(decode_chat, body).param == param


def test_a_value_out_of_a_fixed_set_is_refused_naming_the_values_it_takes() -> None:
    error = refusal(decode_chat, {**CHAT, "response_format": {"type": "xml"}})
    assert '"text", "json_object" or "json_schema"' in error.message
    assert '"required"' in refusal(decode_chat, {**CHAT, "tool_choice": "always"}).message


def test_neutral_values_of_unimplemented_fields_are_accepted() -> None:
    assert decode_completion(json.dumps({**COMPLETION, "user": "u1", "best_of": 1}).encode())
    chat = decode_chat(json.dumps({**CHAT, "tool_choice": "none"}).encode())
    assert chat.messages[0].text == "hi"


def test_response_format_tools_and_the_guided_fields_decode() -> None:
    schema = {"type": "object"}
    form = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    choice = {"type": "function", "function": {"name": "f"}}
    body = {**CHAT, "response_format": form, "tools": [tool], "tool_choice": choice}
    chat = decode_chat(json.dumps(body).encode())
    assert chat.response_format.json_schema.schema == schema
    assert chat.tools[0].function.name == "f" and chat.tool_choice.function.name == "f"
    aliases = {
        "guided_json": "{}",
        "guided_regex": "a+",
        "guided_choice": ["x"],
        "guided_grammar": "g",
    }
    completion = decode_completion(json.dumps({**COMPLETION, **aliases}).encode())
    assert (completion.guided_json, completion.guided_choice) == ("{}", ["x"])
    plain = decode_completion(
        json.dumps({**COMPLETION, "response_format": {"type": "text"}}).encode()
    )
    assert plain.response_format is not None


def test_a_conversation_with_tool_calls_and_results_decodes() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    chat = decode_chat(json.dumps({**CHAT, "messages": messages}).encode())
    assert chat.messages[1].tool_calls[0].function.name == "f" and chat.messages[1].text == ""
    assert chat.messages[2].tool_call_id == "call_1"


def test_the_sampling_controls_vllm_bench_sends_are_accepted() -> None:
    controls = {
        "repetition_penalty": 1.0,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "min_p": 0.1,
        "logit_bias": {"5": 1.0},
        "allowed_token_ids": [1, 2],
        "bad_words": ["x"],
        "seed": -1,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    body = decode_completion(json.dumps({**COMPLETION, **controls}).encode())
    assert body.repetition_penalty == 1.0 and body.stream_options.continuous_usage_stats
    assert decode_chat(json.dumps({**CHAT, **controls}).encode()).bad_words == ["x"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 2**64),
        ("n", 2**64),
        ("seed", 2**70),
        ("stop_token_ids", [1, 2**64]),
        ("allowed_token_ids", [2**64]),
    ],
)
def test_an_integer_too_big_for_the_wire_is_a_400_naming_its_field(field, value) -> None:
    error = refusal(decode_completion, {**COMPLETION, field: value})
    assert error.param.split("[")[0] == field and field in error.message


def test_a_body_nested_100000_deep_is_a_400_naming_the_body() -> None:
    deep = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ApiError) as caught:
        decode_completion(deep)
    assert caught.value.status == 400 and "the request body nests" in caught.value.message


def test_text_parts_are_joined_and_stop_may_be_one_string() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = decode_chat(
        json.dumps({**CHAT, "messages": [{"role": "user", "content": parts}], "stop": "x"}).encode()
    )
    assert body.messages[0].text == "ab" and body.stop_strings == ("x",)


def test_a_body_that_is_not_json_is_a_400() -> None:
    with pytest.raises(ApiError, match="not valid JSON"):
        decode_completion(b"{nope")
