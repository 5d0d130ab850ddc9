"""A request body -> the token ids of its prompts and the SamplingParams of its choices.

`n` choices of a prompt are one request's `n` parallel samples in the workers: the prompt is
computed once, and sample i is seeded `seed + i`, so each choice is reproducible on its own."""

from __future__ import annotations

from dataclasses import dataclass

from aioworker.api.errors import invalid
from aioworker.api.schemas import ChatRequest, CompletionRequest
from aioworker.checkpoint.tokenizer import Tokenizer, TokenizerError
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams

# OpenAI's default max_tokens for completions; chat defaults to what the context leaves.
COMPLETION_MAX_TOKENS = 16


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    # The prompt's text where it came as text (echo returns it).
    text: str | None = None


def completion_prompts(body: CompletionRequest, tokenizer: Tokenizer) -> list[Prompt]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return [Prompt(tokenizer.encode(prompt), prompt)]
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [Prompt(list(prompt))]
    if prompt and all(isinstance(p, str) for p in prompt):
        return [Prompt(tokenizer.encode(p), p) for p in prompt]
    if prompt and all(_is_token_ids(p) for p in prompt):
        return [Prompt(list(p)) for p in prompt]
    raise invalid(
        "prompt must be a string, a list of strings, a list of token ids, or a list of such "
        "lists, and not empty",
        "prompt",
    )


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def chat_prompt(body: ChatRequest, tokenizer: Tokenizer) -> Prompt:
    if not body.messages:
        raise invalid("messages is empty; give at least one message", "messages")
    messages = [{"role": m.role, "content": m.text} for m in body.messages]
    try:
        return Prompt(tokenizer.encode_chat(messages))
    except TokenizerError as exc:
        raise invalid(str(exc), "messages") from None


def completion_params(body: CompletionRequest) -> SamplingParams:
    logprobs = body.logprobs
    return _params(
        body,
        COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens,
        logprobs,
        logprobs if body.echo and logprobs is not None else None,
    )


def chat_params(body: ChatRequest, prompt: Prompt, max_model_len: int) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        left = max_model_len - len(prompt.token_ids)
        if left < 1:
            raise invalid(
                f"the messages take {len(prompt.token_ids)} tokens; max_model_len is "
                f"{max_model_len}, leaving none to generate",
                "messages",
            )
        max_tokens = left
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return _params(body, max_tokens, logprobs, None)


def _params(
    body: CompletionRequest | ChatRequest,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
) -> SamplingParams:
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        seed=body.seed,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        stop=body.stop_strings,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        n=body.n,
    )
    try:
        params.validate()
    except InvalidRequestError as exc:
        raise invalid(str(exc), str(exc).split(" ", 1)[0]) from None
    return params
