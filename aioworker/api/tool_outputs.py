"""What a chat choice's text becomes when the request gives tools: the reader for its tool_choice.
"required" and a named function constrain the output to JSON (tools.py), read back into calls
here once the output ends; "auto" parses the model's own format (tool_calls.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

from aioworker.api.tool_calls import CallCounter, OutputReader, Parsed, call_of
from aioworker.api.tools import ChatTools


class _WholeOutput(CallCounter):
    """A constrained output, read once it has ended: nothing is sent while it streams."""

    def __init__(self) -> None:
        super().__init__()
        self._text = ""

    def feed(self, text: str) -> Parsed:
        self._text += text
        return Parsed()


class RequiredCalls(_WholeOutput):
    """tool_choice "required": a JSON list of {"name", "parameters"}."""

    def finish(self) -> Parsed:
        try:
            value = json.loads(self._text)
        except ValueError:  # cut short (finish_reason "length"): the text as it is
            return Parsed(self._text)
        found = [call_of(item) for item in value] if isinstance(value, list) else [None]
        if not found or None in found:
            return Parsed(self._text)
        return Parsed("", [self._call(*call) for call in found if call is not None])


class NamedCall(_WholeOutput):
    """A named tool_choice: the output is that function's arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def finish(self) -> Parsed:
        try:
            arguments = json.dumps(json.loads(self._text), ensure_ascii=False)
        except ValueError:  # cut short: OpenAI returns the call as far as it got
            arguments = self._text
        return Parsed("", [self._call(self.name, arguments)])


class FirstCallOnly:
    """parallel_tool_calls false under "auto": the model's first call; any after it dropped."""

    def __init__(self, reader: OutputReader) -> None:
        self.reader = reader

    @property
    def num_calls(self) -> int:
        return min(self.reader.num_calls, 1)

    def feed(self, text: str) -> Parsed:
        return self._first(self.reader.feed(text))

    def finish(self) -> Parsed:
        return self._first(self.reader.finish())

    def _first(self, parsed: Parsed) -> Parsed:
        return Parsed(parsed.content, [call for call in parsed.calls if call.index == 0])


def reader_factory(
    tools: ChatTools | None, parser: Callable[[], OutputReader]
) -> Callable[[], OutputReader] | None:
    """Makes one reader per choice; None where the text is plain content. `parser`: the
    model's own format, for "auto"."""
    if tools is None or tools.mode == "none":
        return None
    if tools.mode == "required":
        return RequiredCalls  # the grammar holds it to one call where not parallel
    if tools.mode == "named":
        name = tools.name or ""
        return lambda: NamedCall(name)
    if not tools.is_parallel:
        return lambda: FirstCallOnly(parser())
    return parser
