"""Tool calls in a model's own output format, read as the text streams in: content passes through
as it comes, and a call is held back until it is whole. One class per format: Hermes'
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2 and Qwen3, and what
tool_prompt.py asks of a template without tools), and Llama 3.1's bare JSON
`{"name": ..., "parameters": {...}}`. The chat template says which one the model writes."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ParsedCall:
    # The call's place among the choice's calls (a stream's tool_calls[].index).
    index: int
    id: str
    name: str
    # The arguments as JSON text, as OpenAI returns them.
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class Parsed:
    """What some output text turned out to hold: text for the user, and whole calls."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)

    def __add__(self, other: Parsed) -> Parsed:
        return Parsed(self.content + other.content, self.calls + other.calls)


class OutputReader(Protocol):
    """Reads one choice's text: `feed` each delta, then `finish` once at its end."""

    @property
    def num_calls(self) -> int: ...

    def feed(self, text: str) -> Parsed: ...

    def finish(self) -> Parsed: ...


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def call_of(value: object) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a decoded call object, or None where it is not one.
    Arguments may be named `arguments` or `parameters`, and be an object or its JSON text."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


class CallCounter:
    """Numbers a choice's calls in order and gives each an id."""

    def __init__(self) -> None:
        self.num_calls = 0

    def _call(self, name: str, arguments: str) -> ParsedCall:
        self.num_calls += 1
        return ParsedCall(self.num_calls - 1, new_call_id(), name, arguments)


def held_prefix(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class HermesParser(CallCounter):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        self._is_in_call = False
        # Trailing whitespace of the content, held: dropped where a call follows it.
        self._space = ""

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        parsed = Parsed()
        while self._read_call(parsed) if self._is_in_call else self._read_content(parsed):
            pass
        return parsed

    def finish(self) -> Parsed:
        parsed = Parsed()
        if self._is_in_call:  # unclosed: whole if the model ended at its end-of-turn token
            if not self._add_calls(parsed, self._buffer):
                self._emit(parsed, self.OPEN + self._buffer)
        else:
            self._emit(parsed, self._buffer)
        if not self.num_calls:
            parsed.content += self._space
        self._buffer = self._space = ""
        return parsed

    def _read_content(self, parsed: Parsed) -> bool:
        start = self._buffer.find(self.OPEN)
        if start < 0:
            keep = len(self._buffer) - held_prefix(self._buffer, self.OPEN)
            self._emit(parsed, self._buffer[:keep])
            self._buffer = self._buffer[keep:]
            return False
        self._emit(parsed, self._buffer[:start])
        self._buffer = self._buffer[start + len(self.OPEN) :]
        self._is_in_call = True
        return True

    def _read_call(self, parsed: Parsed) -> bool:
        end = self._buffer.find(self.CLOSE)
        if end < 0:
            return False
        body, self._buffer = self._buffer[:end], self._buffer[end + len(self.CLOSE) :]
        self._is_in_call = False
        if not self._add_calls(parsed, body):  # not a call after all: the text is content
            self._emit(parsed, self.OPEN + body + self.CLOSE)
        return True

    def _add_calls(self, parsed: Parsed, body: str) -> bool:
        """One call object, or a list of them (as some fine-tunes write)."""
        try:
            value = json.loads(body)
        except ValueError:
            return False
        found = [call_of(item) for item in (value if isinstance(value, list) else [value])]
        if not found or None in found:
            return False
        parsed.calls += [self._call(*call) for call in found if call is not None]
        self._space = ""
        return True

    def _emit(self, parsed: Parsed, text: str) -> None:
        text = self._space + text
        content = text.rstrip()
        self._space = text[len(content) :]
        parsed.content += content


class Llama3JsonParser(CallCounter):
    """An output that opens with `{` (or `<|python_tag|>`) is calls, separated by `;`; any
    other output is content, passed through."""

    TAG = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        self._is_calls: bool | None = None  # undecided until the first visible character

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        if self._is_calls is None:
            head = self._buffer.lstrip()
            if not head or self.TAG.startswith(head):
                return Parsed()
            self._is_calls = head.startswith(("{", self.TAG))
        return self._read_calls() if self._is_calls else self._take_content()

    def finish(self) -> Parsed:
        parsed = self._read_calls() if self._is_calls else Parsed()
        return parsed + self._take_content()

    def _read_calls(self) -> Parsed:
        """Each call whose JSON is whole; the rest waits for more text."""
        parsed = Parsed()
        decoder = json.JSONDecoder()
        while True:
            rest = self._buffer.lstrip().removeprefix(self.TAG).lstrip("; \n\t")
            try:
                value, end = decoder.raw_decode(rest)
            except ValueError:
                return parsed
            call = call_of(value)
            if call is None:  # JSON, but not a call: the output is content after all
                self._is_calls = False
                return parsed
            parsed.calls.append(self._call(*call))
            self._buffer = rest[end:]

    def _take_content(self) -> Parsed:
        content, self._buffer = self._buffer, ""
        if self.num_calls:
            content = content.strip()
        return Parsed(content)


def parser_for(template: str | None, takes_tools: bool) -> type[HermesParser | Llama3JsonParser]:
    """The format a model writes its calls in, from its chat template. A template that takes no
    tools is taught Hermes' format (tool_prompt.py)."""
    if not takes_tools or template is None or HermesParser.OPEN in template:
        return HermesParser
    if Llama3JsonParser.TAG in template or '"parameters"' in template:
        return Llama3JsonParser
    return HermesParser
