"""What /v1/completions and /v1/chat/completions return, whole or as stream chunks: the two
endpoints share everything else (serving.py). A chat choice read for tool calls carries them as
OpenAI's `tool_calls`, and each call streams as two chunks once it is whole: its id and name,
then its arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aioworker.api.choices import Choice
from aioworker.api.logprob_format import TokenTexts, chat_logprobs, completion_logprobs
from aioworker.api.tool_calls import OutputReader, Parsed, ParsedCall
from aioworker.core.outputs import RequestOutput


class CompletionShape:
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, texts: TokenTexts, echo: bool) -> None:
        self.texts = texts
        self.echo = echo
        # A choice's first chunk carries the echoed prompt, even before any text is ready.
        self.chunk_on_first = echo

    def full_choice(self, choice: Choice) -> dict[str, Any]:
        logprobs = None
        if choice.logprobs or choice.prompt_logprobs is not None:
            logprobs = completion_logprobs(
                choice.logprobs, self.texts, len(self._echoed(choice)), self._prompt(choice)
            )
        return {
            "index": choice.index,
            "text": self._echoed(choice) + choice.text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }

    def chunk_choices(
        self, choice: Choice, delta: str, out: RequestOutput, is_first: bool
    ) -> list[dict[str, Any]]:
        prefix = self._echoed(choice) if is_first else ""
        logprobs = None
        if out.logprobs is not None or (is_first and out.prompt_logprobs is not None):
            offset = len(choice.text) - len(delta) + len(self._echoed(choice))
            prompt = self._prompt(choice) if is_first else None
            logprobs = completion_logprobs(out.logprobs or [], self.texts, offset, prompt)
        body = {
            "index": choice.index,
            "text": prefix + delta,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }
        return [body]

    def opening(self, choice: Choice) -> dict[str, Any] | None:
        return None

    def _echoed(self, choice: Choice) -> str:
        if not self.echo:
            return ""
        prompt = choice.prompt
        return (
            prompt.text
            if prompt.text is not None
            else self.texts.tokenizer.decode(prompt.token_ids)
        )

    def _prompt(self, choice: Choice) -> tuple[list[int], list] | None:
        if not self.echo or choice.prompt_logprobs is None:
            return None
        return choice.prompt.token_ids, choice.prompt_logprobs


class ChatShape:
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    chunk_on_first = False

    def __init__(
        self, texts: TokenTexts, new_reader: Callable[[], OutputReader] | None = None
    ) -> None:
        """`new_reader`: makes the reader of a choice's tool calls (tool_outputs.py); None: the
        text is all content."""
        self.texts = texts
        self.new_reader = new_reader
        self._readers: dict[int, OutputReader] = {}  # a stream's, by choice index

    def full_choice(self, choice: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        reason = choice.finish_reason
        if self.new_reader is not None:
            reader = self.new_reader()
            parsed = reader.feed(choice.text) + reader.finish()
            message = assistant_message(parsed)
            reason = finish_reason(reason, reader.num_calls)
        return {
            "index": choice.index,
            "message": message,
            "logprobs": chat_logprobs(choice.logprobs, self.texts) if choice.logprobs else None,
            "finish_reason": reason,
        }

    def chunk_choices(
        self, choice: Choice, delta: str, out: RequestOutput, is_first: bool
    ) -> list[dict[str, Any]]:
        """The choice's chunks for this output: none while a tool call is held back."""
        parsed, num_calls = self._read(choice, delta, out.finished)
        deltas = [{"content": parsed.content}] if parsed.content else []
        deltas += [chunk for call in parsed.calls for chunk in call_deltas(call)]
        if not deltas and not out.finished and not out.logprobs:
            return []
        bodies = [
            {"index": choice.index, "delta": d, "logprobs": None, "finish_reason": None}
            for d in deltas or [{}]
        ]
        if out.logprobs:
            bodies[0]["logprobs"] = chat_logprobs(out.logprobs, self.texts)
        bodies[-1]["finish_reason"] = finish_reason(choice.finish_reason, num_calls)
        return bodies

    def opening(self, choice: Choice) -> dict[str, Any] | None:
        """Chat streams open each choice with the assistant's role."""
        return {
            "index": choice.index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def _read(self, choice: Choice, delta: str, finished: bool) -> tuple[Parsed, int]:
        """What the delta adds, and how many calls the choice has made so far."""
        if self.new_reader is None:
            return Parsed(delta), 0
        reader = self._readers.get(choice.index)
        if reader is None:
            reader = self._readers[choice.index] = self.new_reader()
        parsed = reader.feed(delta)
        if finished:
            parsed += reader.finish()
        return parsed, reader.num_calls


def assistant_message(parsed: Parsed) -> dict[str, Any]:
    """OpenAI's form: content null when the message is only calls."""
    if not parsed.calls:
        return {"role": "assistant", "content": parsed.content}
    calls = [call.as_openai() for call in parsed.calls]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}


def call_deltas(call: ParsedCall) -> list[dict[str, Any]]:
    head = {**call.as_openai(), "index": call.index}
    head["function"] = {"name": call.name, "arguments": ""}
    arguments = {"index": call.index, "function": {"arguments": call.arguments}}
    return [{"tool_calls": [head]}, {"tool_calls": [arguments]}]


def finish_reason(reason: str | None, num_calls: int) -> str | None:
    """A choice that ended by itself having made calls ended to have them run."""
    return "tool_calls" if num_calls and reason == "stop" else reason
