"""The request bodies of the HTTP routes, decoded strictly: a field we do not implement is refused
by name, never ignored. Fields of OpenAI's that change nothing at their neutral value (best_of
equal to n) are accepted only at that value.

Beyond OpenAI's fields, as vLLM and SGLang accept them: top_k, min_p, repetition_penalty,
min_tokens, stop_token_ids, ignore_eos, allowed_token_ids, bad_words,
stream_options.continuous_usage_stats, and the guided_* constraints (guided_json, guided_regex,
guided_choice, guided_grammar). Integers are bounded to 64 bits here, so a number too big for the
wire is a 400 naming its field."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from aioworker.api.errors import ApiError, invalid

# What the wire (msgpack) carries; anything larger could not be a valid value of any field.
Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False
    # Every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class TextPart(_Body, kw_only=True):
    type: Literal["text"]
    text: str


class CalledFunction(_Body, kw_only=True):
    name: str
    # A JSON object as text, as OpenAI returns it.
    arguments: str


class ToolCall(_Body, kw_only=True):
    """A call an assistant message made (the conversation so far, sent back)."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Body, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    # A tool message: the call it answers.
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class JsonSchemaSpec(_Body, kw_only=True):
    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    # Outputs always follow the schema here; accepted either way.
    strict: bool | None = None


class TextFormat(_Body, tag="text", tag_field="type"):
    pass


class JsonObjectFormat(_Body, tag="json_object", tag_field="type"):
    pass


class JsonSchemaFormat(_Body, tag="json_schema", tag_field="type"):
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


# omit_defaults: the tool as the template and the tool description see it, without nulls.
class FunctionSpec(_Body, kw_only=True, omit_defaults=True):
    name: str
    description: str | None = None
    # A JSON schema of the arguments (an object); none: the function takes no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Body, kw_only=True):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(_Body, kw_only=True):
    name: str


class NamedToolChoice(_Body, kw_only=True):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class _Sampling(_Body, kw_only=True):
    model: str
    n: Int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None
    min_p: float | None = None
    min_tokens: Int = 0
    # -1: no seed (as vLLM takes it).
    seed: Int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    # Token ids as strings (OpenAI's form), to -100..100.
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[Int] | None = None
    # Words never generated, each as given and with a leading space (prompts.py tokenizes them).
    bad_words: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # An end-user label (abuse monitoring at OpenAI): accepted, changes nothing.
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's names for a constraint on the output (guidance.py): at most one per request.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of those (checked in prompts.py).
    prompt: str | list[Any]
    max_tokens: Int | None = None
    echo: bool = False
    # 0..20 alternatives per token (OpenAI allows 5; we allow MAX_LOGPROBS).
    logprobs: Int | None = None
    best_of: Int | None = None
    suffix: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    logprobs: bool = False
    top_logprobs: Int | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    # False: at most one call per answer.
    parallel_tool_calls: bool = True


def neutral_only(body: CompletionRequest) -> None:
    """Refuse OpenAI fields we do not implement, unless they hold the value that changes nothing."""
    if body.best_of not in (None, body.n):
        raise invalid(f"best_of {body.best_of} is not supported; leave it unset", "best_of")
    if body.suffix:
        raise invalid("suffix is not supported (no insertion); leave it unset", "suffix")


class TokenizeRequest(_Body, kw_only=True):
    """POST /tokenize: a prompt, or chat messages through the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # Default: true for a prompt, false for messages (the template writes them).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Body, kw_only=True):
    model: str | None = None
    tokens: list[Int]


_COMPLETION = msgspec.json.Decoder(CompletionRequest)
_CHAT = msgspec.json.Decoder(ChatRequest)
_TOKENIZE = msgspec.json.Decoder(TokenizeRequest)
_DETOKENIZE = msgspec.json.Decoder(DetokenizeRequest)
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")
_AT = re.compile(r" - at `\$\.?([^`]*)`")
# The values a field takes, named when a client sends another.
_ALLOWED = {
    "response_format.type": '"text", "json_object" or "json_schema"',
    "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
}


def decode_completion(raw: bytes) -> CompletionRequest:
    body = _decode(_COMPLETION, raw)
    neutral_only(body)
    return body


def decode_chat(raw: bytes) -> ChatRequest:
    return _decode(_CHAT, raw)


def decode_tokenize(raw: bytes) -> TokenizeRequest:
    body = _decode(_TOKENIZE, raw)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("give either prompt or messages, not both or neither", "prompt")
    return body


def decode_detokenize(raw: bytes) -> DetokenizeRequest:
    return _decode(_DETOKENIZE, raw)


def _decode(decoder: msgspec.json.Decoder, raw: bytes) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise invalid(
            "the request body nests arrays or objects too deeply; no field of this API nests "
            "more than a few levels"
        ) from None


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
    reason = message[: where.start()] if where else message
    if path in _ALLOWED:
        reason += f"; give {_ALLOWED[path]}"
    return invalid(f"{path or 'the request body'}: {reason}", path)
