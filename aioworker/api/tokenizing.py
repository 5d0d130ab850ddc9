"""Tokenizing off the event loop, on a small pool of threads, so /health and the streams already
running are answered while a long prompt is tokenized; and a text too long to fit refused before
any tokenizing. The bound is exact: no token stands for more characters than the longest
vocabulary entry, so a text longer than max_model_len times that has more than max_model_len
tokens, whatever they turn out to be."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aioworker.api.errors import invalid
from aioworker.checkpoint.tokenizer import Tokenizer, TokenizerError

T = TypeVar("T")


class PromptTokenizer:
    """The model's tokenizer as the routes use it, with the limits of the model it serves:
    `max_model_len` and `vocab_size` (the token ids the model takes, from its config.json)."""

    def __init__(
        self, tokenizer: Tokenizer, max_model_len: int, vocab_size: int, num_threads: int
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # No token stands for more characters of text than this.
        self.chars_per_token = tokenizer.longest_token_chars
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenize")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def encode(
        self,
        text: str,
        param: str,
        add_special_tokens: bool = True,
        max_tokens: int | None = None,
    ) -> list[int]:
        """The text's token ids; 400 naming `param`, without tokenizing, when it has too many
        characters to fit in `max_tokens` tokens (default: max_model_len)."""
        self.check_length(text, param, max_tokens or self.max_model_len)
        return await self._run(self.tokenizer.encode_unlocked, text, add_special_tokens)

    async def encode_chat(
        self,
        messages: list[dict[str, Any]],
        param: str = "messages",
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The messages (and tools) through the chat template (which writes the special tokens
        itself, so none are added by default), then tokenized; the length check is on the
        rendered text."""
        try:
            text = await self._run(
                self.tokenizer.apply_chat_template, messages, add_generation_prompt, tools
            )
        except TokenizerError as exc:
            raise invalid(chat_template_error(str(exc)), param) from None
        return await self.encode(text, param, add_special_tokens)

    async def decode(self, token_ids: list[int]) -> str:
        return await self._run(self.tokenizer.decode, token_ids)

    def check_length(self, text: str, param: str, max_tokens: int) -> None:
        per_token = self.chars_per_token
        if len(text) > max_tokens * per_token:
            limit = "max_model_len" if max_tokens == self.max_model_len else "the limit"
            raise invalid(
                f"{param} has {len(text)} characters, more than {max_tokens} tokens ({limit}) "
                f"can hold: at most {max_tokens * per_token}, {per_token} per token; shorten it",
                param,
            )

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """Every id in the model's vocabulary (a number too big for the wire is not)."""
        for index, token_id in enumerate(token_ids):
            if not 0 <= token_id < self.vocab_size:
                raise invalid(
                    f"{param} holds token id {token_id} at index {index}, outside the "
                    f"vocabulary [0, {self.vocab_size})",
                    param,
                )

    def check_fits(self, token_ids: list[int], param: str, what: str) -> None:
        """The worker's admission rule, checked before sending: `what` names the prompt."""
        if not token_ids:
            raise invalid(f"{param} is empty; give at least one token", param)
        if len(token_ids) > self.max_model_len:
            raise invalid(
                f"{what} has {len(token_ids)} tokens; max_model_len is {self.max_model_len}",
                param,
            )

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


def chat_template_error(message: str) -> str:
    if "no chat template" in message:
        return (
            "this model has no chat template; start the server with --chat-template FILE "
            "(api.chat_template), or send the text to /v1/completions"
        )
    return message
