"""tools and tool_choice: bad tools refused naming the entry, each choice's mode, and the JSON
schemas "required" and a named function constrain the output to (checked with jsonschema: what
they let through is a call of a tool with that tool's arguments, and nothing else)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from aioworker.api.errors import ApiError
from aioworker.api.schemas import decode_chat
from aioworker.api.tools import NO_ARGUMENTS, chat_tools

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


def tools_of(functions: list[dict], choice=None):
    tools = [{"type": "function", "function": f} for f in functions]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    if choice is not None:
        body["tool_choice"] = choice
    return chat_tools(decode_chat(json.dumps(body).encode()))


def refusal(functions: list[dict], choice=None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        tools_of(functions, choice)
    assert caught.value.status == 400
    return caught.value


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize(
    ("functions", "param", "says"),
    [
        ([{"name": "get weather"}], "tools[0].function.name", "letters, digits"),
        ([{"name": "x" * 65}], "tools[0].function.name", "1 to 64"),
        ([WEATHER, WEATHER], "tools[1].function", "given twice"),
        (
            [TIME, {"name": "f", "parameters": {"type": "string"}}],
            "tools[1].function.parameters",
            '"type": "object"',
        ),
    ],
)
def test_a_bad_tool_is_refused_naming_its_entry(functions, param: str, says: str) -> None:
    error = refusal(functions)
    assert error.param == param and says in error.message, error.message


def test_each_tool_choice_has_its_mode() -> None:
    assert tools_of([WEATHER]).mode == "auto"  # the default where tools are given
    assert tools_of([WEATHER], "none").mode == "none"
    assert tools_of([WEATHER], "auto").guidance is None
    assert tools_of([WEATHER], "required").mode == "required"
    chosen = tools_of([WEATHER, TIME], named("get_time"))
    assert (chosen.mode, chosen.name) == ("named", "get_time")
    assert chosen.tools[1] == {"type": "function", "function": TIME}  # as the template takes them


def test_no_tools_is_no_tool_use_unless_tool_choice_asks_for_a_call() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": []}
    assert chat_tools(decode_chat(json.dumps({**body, "tool_choice": "auto"}).encode())) is None
    with pytest.raises(ApiError) as caught:
        chat_tools(decode_chat(json.dumps({**body, "tool_choice": "required"}).encode()))
    assert caught.value.param == "tools"


def test_a_named_function_not_in_tools_is_refused_listing_the_tools() -> None:
    error = refusal([WEATHER, TIME], named("get_news"))
    assert error.param == "tool_choice.function.name"
    assert "'get_news'" in error.message and "'get_weather', 'get_time'" in error.message


def test_a_named_function_constrains_the_output_to_its_arguments() -> None:
    guidance = tools_of([TIME, WEATHER], named("get_weather")).guidance
    assert guidance.guided.json_schema == WEATHER["parameters"]
    assert guidance.field == "tools[1].function.parameters"
    no_parameters = tools_of([{"name": "ping"}], named("ping")).guidance
    assert no_parameters.guided.json_schema == NO_ARGUMENTS


@pytest.mark.parametrize(
    ("calls", "is_valid"),
    [
        ([{"name": "get_weather", "parameters": {"city": "Oslo"}}], True),
        (
            [
                {"name": "get_time", "parameters": {}},
                {"name": "get_weather", "parameters": {"city": "Rome"}},
            ],
            True,
        ),
        ([], False),  # at least one call
        ([{"name": "get_news", "parameters": {}}], False),
        ([{"name": "get_weather", "parameters": {}}], False),  # its required city
        ([{"name": "get_weather"}], False),
        ([{"name": "get_time", "parameters": {}, "extra": 1}], False),
    ],
)
def test_required_constrains_the_output_to_calls_of_the_tools(calls, is_valid: bool) -> None:
    guidance = tools_of([WEATHER, TIME], "required").guidance
    assert guidance.field == "tools"
    validator = jsonschema.Draft202012Validator(guidance.guided.json_schema)
    assert validator.is_valid(calls) == is_valid


def test_parallel_tool_calls_false_asks_for_one_call() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": WEATHER}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    tools = chat_tools(decode_chat(json.dumps(body).encode()))
    validator = jsonschema.Draft202012Validator(tools.guidance.guided.json_schema)
    call = {"name": "get_weather", "parameters": {"city": "Oslo"}}
    assert validator.is_valid([call]) and not validator.is_valid([call, call])
    assert not tools.is_parallel
