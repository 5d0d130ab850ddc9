"""A request body -> the SamplingParams of its choices, validated by the same `validate()` the
workers run and with every token id checked against the vocabulary, so an error names the field
as the client wrote it.

`n` choices of a prompt are one request's `n` parallel samples in the workers: the prompt is
computed once, and sample i is seeded `seed + i`, so each choice is reproducible on its own."""

from __future__ import annotations

import re

from aioworker.api.errors import invalid
from aioworker.api.guidance import Guidance
from aioworker.api.prompts import Prompt
from aioworker.api.schemas import ChatRequest, CompletionRequest
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.core.sampling_params import (
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_LOGPROBS,
    InvalidRequestError,
    SamplingParams,
)

# OpenAI's default max_tokens for completions; chat defaults to what the context leaves.
COMPLETION_MAX_TOKENS = 16
# The field a validation message is about: its first word, or one of these phrases.
_FIELD = re.compile(r"^a (bad word) |^(\w+) ")


async def completion_params(
    body: CompletionRequest, tokens: PromptTokenizer, guidance: Guidance | None = None
) -> SamplingParams:
    """`guidance`: the constraint on the output the body asks for (guidance.py)."""
    logprobs = body.logprobs
    max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    prompt_logprobs = logprobs if body.echo and logprobs is not None else None
    return await _params(body, tokens, max_tokens, logprobs, prompt_logprobs, guidance)


async def chat_params(
    body: ChatRequest, prompt: Prompt, tokens: PromptTokenizer, guidance: Guidance | None = None
) -> SamplingParams:
    top = body.top_logprobs
    if top is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise invalid(
            f"top_logprobs is {top}; it must be between 0 and {MAX_LOGPROBS}", "top_logprobs"
        )
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        left = tokens.max_model_len - len(prompt.token_ids)
        if left < 1:
            raise invalid(
                f"the messages take {len(prompt.token_ids)} tokens; max_model_len is "
                f"{tokens.max_model_len}, leaving none to generate",
                "messages",
            )
        max_tokens = left
    logprobs = (top or 0) if body.logprobs else None
    renamed = {"max_tokens": "max_completion_tokens"} if body.max_completion_tokens else {}
    return await _params(body, tokens, max_tokens, logprobs, None, guidance, renamed)


async def _params(
    body: CompletionRequest | ChatRequest,
    tokens: PromptTokenizer,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    guidance: Guidance | None = None,
    renamed: dict[str, str] | None = None,
) -> SamplingParams:
    """`renamed`: fields of SamplingParams the client set under another name."""
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        temperature=_or(body.temperature, 1.0),
        top_p=_or(body.top_p, 1.0),
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        min_p=_or(body.min_p, 0.0),
        seed=None if body.seed == -1 else body.seed,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        stop=body.stop_strings,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        n=body.n,
        repetition_penalty=_or(body.repetition_penalty, 1.0),
        presence_penalty=_or(body.presence_penalty, 0.0),
        frequency_penalty=_or(body.frequency_penalty, 0.0),
        logit_bias=logit_bias(body.logit_bias),
        allowed_token_ids=_tuple_or_none(body.allowed_token_ids),
        bad_words_token_ids=await bad_words(body.bad_words, tokens),
        guided=guidance.guided if guidance is not None else None,
    )
    try:
        params.validate()
    except InvalidRequestError as exc:
        error = invalid(str(exc), param_of(str(exc), renamed or {}))
        raise guidance.rename(error) if guidance is not None else error from None
    for field, token_ids in params.token_ids_to_check():
        tokens.check_token_ids(token_ids, field)
    return params


def logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's keys are token ids written as strings."""
    by_id = {}
    for key, value in (bias or {}).items():
        try:
            by_id[int(key)] = value
        except ValueError:
            raise invalid(
                f"logit_bias has the key {key[:40]!r}, which is not a token id; keys are token "
                'ids written as strings, such as "50256"',
                "logit_bias",
            ) from None
    return by_id


async def bad_words(
    words: list[str] | None, tokens: PromptTokenizer
) -> tuple[tuple[int, ...], ...]:
    """Each word's token ids as written and with a leading space (how it appears after another
    word), without repeats."""
    words = words or []
    if len(words) > MAX_BAD_WORDS:
        raise invalid(
            f"bad_words has {len(words)} entries; at most {MAX_BAD_WORDS} are allowed", "bad_words"
        )
    sequences: dict[tuple[int, ...], None] = {}
    for index, word in enumerate(words):
        param = f"bad_words[{index}]"
        for text in (word, " " + word.lstrip(" ")):
            ids = await tokens.encode(text, param, False, MAX_BAD_WORD_TOKENS)
            if not ids:
                raise invalid(f"{param} is empty; give a word", param)
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise invalid(
                    f"{param} has {len(ids)} tokens; a bad word may have at most "
                    f"{MAX_BAD_WORD_TOKENS}",
                    param,
                )
            sequences[tuple(ids)] = None
    return tuple(sequences)


def param_of(message: str, renamed: dict[str, str]) -> str | None:
    """The field a SamplingParams validation message names, as the client wrote it."""
    match = _FIELD.match(message)
    if match is None:
        return None
    field = match[2] or match[1]
    field = "bad_words" if field == "bad word" else field
    return renamed.get(field, field)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _tuple_or_none(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)
