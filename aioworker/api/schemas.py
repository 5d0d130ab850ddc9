"""The request bodies of /v1/completions and /v1/chat/completions, decoded strictly: a field we
do not implement is refused by name, never ignored. Fields of OpenAI's that change nothing at
their neutral value (a penalty of 0, an empty logit_bias) are accepted only at that value.

Beyond OpenAI's fields, as vLLM and SGLang accept them: top_k, min_tokens, stop_token_ids,
ignore_eos."""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from aioworker.api.errors import ApiError, invalid


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False


class TextPart(_Body, kw_only=True):
    type: Literal["text"]
    text: str


class ChatMessage(_Body, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class _Sampling(_Body, kw_only=True):
    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_tokens: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # An end-user label (abuse monitoring at OpenAI): accepted, changes nothing.
    user: str | None = None
    # Accepted only at their neutral value (see neutral_only).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of those (checked in prompts.py).
    prompt: str | list[Any]
    max_tokens: int | None = None
    echo: bool = False
    # 0..20 alternatives per token (OpenAI allows 5; we allow MAX_LOGPROBS).
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


def neutral_only(body: _Sampling) -> None:
    """Refuse OpenAI fields we do not implement, unless they hold the value that changes nothing."""
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(body, name)
        if value not in (None, 0, 0.0):
            raise invalid(f"{name} {value} is not supported; only 0 (no penalties here)", name)
    if body.logit_bias:
        raise invalid("logit_bias is not supported; leave it empty", "logit_bias")
    if isinstance(body, CompletionRequest):
        if body.best_of not in (None, body.n):
            raise invalid(f"best_of {body.best_of} is not supported; leave it unset", "best_of")
        if body.suffix:
            raise invalid("suffix is not supported (no insertion); leave it unset", "suffix")
    if isinstance(body, ChatRequest):
        if body.tools:
            raise invalid("tools are not supported yet; leave tools unset", "tools")
        if body.tool_choice not in (None, "none", "auto"):
            raise invalid("tool_choice is not supported (no tools here)", "tool_choice")
        if body.response_format not in (None, {"type": "text"}):
            raise invalid("response_format: only {'type': 'text'} is supported", "response_format")


_COMPLETION = msgspec.json.Decoder(CompletionRequest)
_CHAT = msgspec.json.Decoder(ChatRequest)
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")
_AT = re.compile(r"at `\$\.?([^`]*)`")


def decode_completion(raw: bytes) -> CompletionRequest:
    return _decode(_COMPLETION, raw)


def decode_chat(raw: bytes) -> ChatRequest:
    return _decode(_CHAT, raw)


def _decode(decoder: msgspec.json.Decoder, raw: bytes) -> Any:
    try:
        body = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    neutral_only(body)
    return body


def _validation_error(message: str) -> ApiError:
    """msgspec's message, reworded to name the field the way a client wrote it."""
    where = _AT.search(message)
    path = where.group(1) if where else None
    if unknown := _UNKNOWN.search(message):
        field = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        return invalid(f"{field} is not supported by this server; remove it", field)
    if missing := _MISSING.search(message):
        field = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return invalid(f"{field} is required", field)
    return invalid(f"invalid request: {message}", path)
