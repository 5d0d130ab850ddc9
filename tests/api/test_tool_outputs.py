"""A choice's text read back into calls for each tool_choice: the JSON that "required" and a
named function constrain the output to, and which reader each mode gets."""

from __future__ import annotations

import json

from aioworker.api.tool_calls import HermesParser
from aioworker.api.tool_outputs import FirstCallOnly, NamedCall, RequiredCalls, reader_factory
from aioworker.api.tools import ChatTools


def finish(reader, text: str):
    assert reader.feed(text).calls == []  # nothing until the output ends
    return reader.finish()


def test_required_reads_a_list_of_calls() -> None:
    text = json.dumps(
        [
            {"name": "get_weather", "parameters": {"city": "Oslo"}},
            {"name": "get_time", "parameters": {}},
        ],
        indent=2,
    )
    parsed = finish(RequiredCalls(), text)
    assert [(c.index, c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (0, "get_weather", {"city": "Oslo"}),
        (1, "get_time", {}),
    ]
    assert parsed.content == ""


def test_required_cut_short_is_the_text_as_content() -> None:
    cut = '[{"name": "get_weather", "parameters": {"ci'
    parsed = finish(RequiredCalls(), cut)
    assert parsed.content == cut and parsed.calls == []


def test_named_reads_the_arguments_compactly_and_keeps_them_as_cut() -> None:
    parsed = finish(NamedCall("get_weather"), '{\n  "city": "Oslo"\n}')
    assert (parsed.calls[0].name, parsed.calls[0].arguments) == ("get_weather", '{"city": "Oslo"}')
    cut = finish(NamedCall("get_weather"), '{"city": "Os')
    assert cut.calls[0].arguments == '{"city": "Os'


def test_each_mode_gets_its_reader() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert reader_factory(None, HermesParser) is None
    assert reader_factory(ChatTools(tools, "none"), HermesParser) is None
    assert reader_factory(ChatTools(tools, "auto"), HermesParser) is HermesParser
    assert reader_factory(ChatTools(tools, "required"), HermesParser) is RequiredCalls
    named = reader_factory(ChatTools(tools, "named", "f"), HermesParser)()
    assert isinstance(named, NamedCall) and named.name == "f"


def test_auto_without_parallel_calls_keeps_the_first_call() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    reader = reader_factory(ChatTools(tools, "auto", is_parallel=False), HermesParser)()
    assert isinstance(reader, FirstCallOnly)
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    parsed = reader.feed(f"Hi. {call}{call}") + reader.finish()
    assert parsed.content == "Hi." and [c.index for c in parsed.calls] == [0]
    assert reader.num_calls == 1
