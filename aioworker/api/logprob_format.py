"""Logprobs in the two shapes of OpenAI's API: the legacy completions object (parallel lists of
tokens, logprobs, top alternatives as {token: logprob}, and text offsets) and chat's list of
{token, logprob, bytes, top_logprobs}."""

from __future__ import annotations

from typing import Any

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.outputs import TokenLogprobs


class TokenTexts:
    """Each token id's own text, decoded once (special tokens shown)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __getitem__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text


def completion_logprobs(
    entries: list[TokenLogprobs],
    texts: TokenTexts,
    text_offset: int,
    prompt: tuple[list[int], list[TokenLogprobs]] | None = None,
) -> dict[str, Any]:
    """`prompt` (echo): the prompt's token ids and the logprobs of all but its first token."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = text_offset

    def add(token_id: int, logprob: float | None, alternatives: dict | None) -> None:
        nonlocal offset
        text = texts[token_id]
        tokens.append(text)
        token_logprobs.append(logprob)
        top.append(alternatives)
        offsets.append(offset)
        offset += len(text)

    if prompt is not None:
        prompt_ids, prompt_entries = prompt
        add(prompt_ids[0], None, None)
        for entry in prompt_entries:
            add(entry.token_id, entry.logprob, _top_dict(entry, texts))
    for entry in entries:
        add(entry.token_id, entry.logprob, _top_dict(entry, texts))
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _top_dict(entry: TokenLogprobs, texts: TokenTexts) -> dict[str, float]:
    return {texts[t]: lp for t, lp in zip(entry.top_token_ids, entry.top_logprobs, strict=True)}


def chat_logprobs(entries: list[TokenLogprobs], texts: TokenTexts) -> dict[str, Any]:
    return {"content": [_chat_entry(entry, texts) for entry in entries], "refusal": None}


def _chat_entry(entry: TokenLogprobs, texts: TokenTexts) -> dict[str, Any]:
    top = [
        _chat_token(t, lp, texts)
        for t, lp in zip(entry.top_token_ids, entry.top_logprobs, strict=True)
    ]
    return {**_chat_token(entry.token_id, entry.logprob, texts), "top_logprobs": top}


def _chat_token(token_id: int, logprob: float, texts: TokenTexts) -> dict[str, Any]:
    text = texts[token_id]
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
