"""Guided outputs and tool calls through the official `openai` client against a live
`aioworker serve --api-port` on the embedded model: response_format json_schema and tool_choice
"required" sampled at temperature 1.0 (every output validates), a named function, the model's own
calls under "auto" (whole and streamed), vLLM's guided_* fields, and bad constraints refused with
a 400 while another request runs on."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

NUM_SAMPLES = 20
SAMPLED = {"model": "embedded", "temperature": 1.0}
GREEDY = {"model": "embedded", "temperature": 0}

# Nested object, array, enum, required fields, a bounded integer; lengths bounded so that every
# sample completes within max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "color", "tags", "address"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


def in_parallel(make, count: int) -> list:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(make, range(count)))


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def check_calls(calls) -> None:
    """Each call names a tool and its arguments (JSON text) follow that tool's schema."""
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_response_format_json_schema_outputs_all_validate(live) -> None:
    client = live.openai()
    form = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}

    def sample(seed: int):
        return client.chat.completions.create(
            messages=ask("Describe a person as JSON."),
            response_format=form,
            seed=seed,
            max_tokens=200,
            **SAMPLED,
        ).choices[0]

    choices = in_parallel(sample, NUM_SAMPLES)
    assert [c.finish_reason for c in choices] == ["stop"] * NUM_SAMPLES
    for choice in choices:
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({c.message.content for c in choices}) > 1  # sampled, not one answer repeated


def test_tool_choice_required_calls_all_validate(live) -> None:
    """Sampled with one call each (parallel_tool_calls false): a list of calls has no bound,
    and at temperature 1.0 a sample may go on calling past any max_tokens."""
    client = live.openai()
    request = {"messages": ask("What is the weather in Paris?"), "tools": TOOLS}

    def sample(seed: int):
        return client.chat.completions.create(
            tool_choice="required",
            parallel_tool_calls=False,
            seed=seed,
            max_tokens=100,
            **request,
            **SAMPLED,
        ).choices[0]

    choices = in_parallel(sample, NUM_SAMPLES)
    assert [c.finish_reason for c in choices] == ["tool_calls"] * NUM_SAMPLES
    for choice in choices:
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        check_calls(choice.message.tool_calls)
    greedy = client.chat.completions.create(
        tool_choice="required", max_tokens=120, **request, **GREEDY
    ).choices[0]
    assert greedy.finish_reason == "tool_calls"
    check_calls(greedy.message.tool_calls)


def test_a_named_function_is_called_with_valid_arguments(live) -> None:
    choice = (
        live.openai()
        .chat.completions.create(
            messages=ask("What time is it in London?"),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=60,
            **GREEDY,
        )
        .choices[0]
    )
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    check_calls([call])


# The 135M model calls a tool by itself once the conversation shows it an earlier call of its
# own; the tools' description in the system message alone does not move it.
EARLIER_CALL = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_rome",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": json.dumps({"city": "Rome", "unit": "celsius"}),
                },
            }
        ],
    },
    {"role": "user", "content": "What is the weather in Tokyo?"},
]


def streamed_calls(chunks) -> tuple[str, dict[int, dict], list]:
    """Content, each call put together from its deltas (by index), and the finish reasons."""
    content, calls, finishes = "", {}, []
    for chunk in chunks:
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = delta.id or call["id"]
            call["name"] = delta.function.name or call["name"]
            call["arguments"] += delta.function.arguments or ""
        finishes.append(choice.finish_reason)
    return content, calls, finishes


def test_auto_returns_the_models_own_calls_whole_and_streamed(live) -> None:
    client = live.openai()
    request = {"messages": EARLIER_CALL, "tools": TOOLS, "max_tokens": 60, **GREEDY}
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls" and not whole.message.content
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Tokyo"
    content, calls, finishes = streamed_calls(
        client.chat.completions.create(stream=True, **request)
    )
    assert content == "" and finishes[-1] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (call.function.name, call.function.arguments)
    ]
    assert calls[0]["id"].startswith("call_")


def test_vllm_guided_fields(live) -> None:
    client = live.openai()
    options = ["yes", "no", "maybe", "never", "always"]
    chat = client.chat.completions.create(
        messages=ask("Will it rain tomorrow?"),
        extra_body={"guided_choice": options},
        max_tokens=10,
        **GREEDY,
    ).choices[0]
    assert chat.message.content in options and chat.finish_reason == "stop"
    date = r"20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d)"
    texts = [
        client.completions.create(
            prompt="The date today is ",
            extra_body={"guided_regex": date},
            max_tokens=20,
            seed=seed,
            **SAMPLED,
        )
        .choices[0]
        .text
        for seed in range(3)
    ]
    assert all(re.fullmatch(date, text) for text in texts), texts


def test_bad_constraints_are_400s_naming_the_field_while_another_request_finishes(live) -> None:
    client = live.openai()
    running = iter(
        client.chat.completions.create(
            messages=ask("Tell me about Paris."), max_tokens=40, stream=True, **GREEDY
        )
    )
    next(running)  # its first token is out: it runs while the bad requests come and go
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            messages=ask("hi"), response_format=bad_schema, max_tokens=5, **GREEDY
        )
    error = caught.value.body
    assert error["param"] == "response_format.json_schema.schema"
    assert error["message"].startswith("response_format.json_schema.schema does not compile")
    assert '"wat"' in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            prompt="x", extra_body={"guided_regex": "(abc"}, max_tokens=5, **GREEDY
        )
    assert caught.value.body["param"] == "guided_regex"
    assert "guided_regex does not compile" in caught.value.body["message"]
    rest = list(running)
    assert rest[-1].choices[0].finish_reason == "length"
    assert "Paris" in "".join(chunk.choices[0].delta.content or "" for chunk in rest)
