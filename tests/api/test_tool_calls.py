"""The tool-call parsers on literal text: content passes through exactly, calls come out whole
(named, with JSON arguments, numbered, with ids), text that only looks like a call stays content,
and fed a character at a time they find what they find fed at once, never streaming a piece of a
call as content."""

from __future__ import annotations

import json

import pytest

from aioworker.api.tool_calls import (
    HermesParser,
    Llama3JsonParser,
    Parsed,
    held_prefix,
    parser_for,
)

WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
WEATHER_ARGS = json.dumps(WEATHER["arguments"])


def hermes(call: dict) -> str:
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def read(parser, text: str, step: int | None = None) -> tuple[Parsed, list[Parsed]]:
    """The whole result, and each feed's (the last is finish's), feeding `step` characters at a
    time (default: all at once)."""
    step = step or max(len(text), 1)
    pieces = [parser.feed(text[i : i + step]) for i in range(0, len(text), step)]
    pieces.append(parser.finish())
    total = Parsed()
    for piece in pieces:
        total += piece
    return total, pieces


def calls(parsed: Parsed) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.calls]


@pytest.mark.parametrize("step", [None, 1, 3])
@pytest.mark.parametrize("parser", [HermesParser, Llama3JsonParser])
@pytest.mark.parametrize(
    "text", ["The capital of France is Paris.", "a < b and <tool>", "  \n", "x {", ""]
)
def test_text_without_calls_is_content_exactly(parser, text: str, step) -> None:
    parsed, _ = read(parser(), text, step)
    assert parsed.content == text and parsed.calls == []


@pytest.mark.parametrize("step", [None, 1, 7])
def test_hermes_calls_are_parsed_and_numbered_with_fresh_ids(step) -> None:
    other = {"name": "get_time", "arguments": {}}
    text = f"Let me check.\n{hermes(WEATHER)}\n{hermes(other)}\n"
    parsed, _ = read(HermesParser(), text, step)
    assert parsed.content == "Let me check."
    assert calls(parsed) == [("get_weather", WEATHER["arguments"]), ("get_time", {})]
    assert [call.index for call in parsed.calls] == [0, 1]
    ids = [call.id for call in parsed.calls]
    assert all(i.startswith("call_") and len(i) > 10 for i in ids) and len(set(ids)) == 2


def test_a_streamed_hermes_call_comes_out_whole_once_closed_never_as_content() -> None:
    text = f"Sure. {hermes(WEATHER)} Done."
    _, pieces = read(HermesParser(), text, 1)
    assert all("<" not in piece.content and "{" not in piece.content for piece in pieces)
    closed = next(i for i, piece in enumerate(pieces) if piece.calls)
    assert closed == text.index("</tool_call>") + len("</tool_call>") - 1  # the last ">"
    assert "".join(p.content for p in pieces) == "Sure. Done."


@pytest.mark.parametrize(
    "call",
    [
        {"name": "get_weather", "arguments": json.dumps(WEATHER["arguments"])},  # as text
        {"name": "get_weather", "parameters": WEATHER["arguments"]},
    ],
)
def test_hermes_takes_arguments_as_text_or_named_parameters(call: dict) -> None:
    parsed, _ = read(HermesParser(), hermes(call))
    assert calls(parsed) == [("get_weather", WEATHER["arguments"])]
    assert parsed.calls[0].arguments == WEATHER_ARGS


def test_hermes_takes_a_list_of_calls_in_one_tag() -> None:
    text = f"<tool_call>[{json.dumps(WEATHER)}, {json.dumps(WEATHER)}]</tool_call>"
    parsed, _ = read(HermesParser(), text)
    assert len(parsed.calls) == 2 and parsed.content == ""


@pytest.mark.parametrize(
    "body",
    ['{"name": "f", "arguments": ', '{"arguments": {}}', '{"name": "f", "arguments": [1]}', "[]"],
)
def test_what_is_not_a_call_between_the_tags_stays_content(body: str) -> None:
    text = f"a <tool_call>{body}</tool_call> b"
    parsed, _ = read(HermesParser(), text, 2)
    assert parsed.content == text and parsed.calls == []


def test_an_unclosed_call_counts_when_whole_and_is_content_when_cut() -> None:
    whole = f"<tool_call>\n{json.dumps(WEATHER)}\n"  # the model ended at its end-of-turn token
    assert calls(read(HermesParser(), whole)[0]) == [("get_weather", WEATHER["arguments"])]
    cut = '<tool_call>\n{"name": "get_weather", "argu'  # max_tokens ran out
    parsed, _ = read(HermesParser(), cut, 4)
    assert parsed.content == cut and parsed.calls == []


def test_held_prefix_is_the_longest_tail_that_may_open_the_marker() -> None:
    assert held_prefix("abc <tool_c", "<tool_call>") == len("<tool_c")
    assert held_prefix("abc <", "<tool_call>") == 1
    assert held_prefix("abc", "<tool_call>") == 0


@pytest.mark.parametrize("step", [None, 1, 5])
@pytest.mark.parametrize("prefix", ["", "<|python_tag|>", "\n "])
def test_llama3_json_calls(prefix: str, step) -> None:
    second = {"name": "get_time", "parameters": {"zone": "UTC"}}
    first = {"name": "get_weather", "parameters": WEATHER["arguments"]}
    text = f"{prefix}{json.dumps(first)}; {json.dumps(second)}"
    parsed, _ = read(Llama3JsonParser(), text, step)
    assert calls(parsed) == [("get_weather", WEATHER["arguments"]), ("get_time", {"zone": "UTC"})]
    assert parsed.content == "" and [c.index for c in parsed.calls] == [0, 1]


def test_llama3_json_streams_each_call_once_its_json_is_whole() -> None:
    first = json.dumps({"name": "a", "parameters": {}})
    text = f"{first}; " + json.dumps({"name": "b", "parameters": {}})
    _, pieces = read(Llama3JsonParser(), text, 1)
    found = [i for i, piece in enumerate(pieces) if piece.calls]
    assert found[0] == len(first) - 1 and len(found) == 2


@pytest.mark.parametrize("text", ['{"answer": 42}', '{"name": "f", "parameters": {"x"', "{oops}"])
def test_llama3_json_that_is_not_a_call_is_content(text: str) -> None:
    parsed, _ = read(Llama3JsonParser(), text, 3)
    assert parsed.content == text and parsed.calls == []


def test_llama3_text_streams_from_its_first_visible_character() -> None:
    _, pieces = read(Llama3JsonParser(), "  Paris is", 1)
    assert [p.content for p in pieces[:3]] == ["", "", "  P"]


QWEN = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools> reply in <tool_call></tool_call>{% endif %}"
)
LLAMA = (
    '{% if tools %}{{ tools | tojson }} {"name": ..., "parameters": ...}<|python_tag|>{% endif %}'
)


@pytest.mark.parametrize(
    ("template", "takes_tools", "parser"),
    [
        (QWEN, True, HermesParser),
        (LLAMA, True, Llama3JsonParser),
        ("{{ messages }} <|im_start|>", False, HermesParser),  # taught Hermes by tool_prompt
        (LLAMA, False, HermesParser),
        ("{{ tools }} [TOOL_CALLS]", True, HermesParser),  # a format we do not read: the default
        (None, False, HermesParser),
    ],
)
def test_the_format_is_read_from_the_chat_template(template, takes_tools, parser) -> None:
    assert parser_for(template, takes_tools) is parser
