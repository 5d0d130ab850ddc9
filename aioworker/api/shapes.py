"""What /v1/completions and /v1/chat/completions return, whole or as stream chunks: the two
endpoints share everything else (serving.py)."""

from __future__ import annotations

from typing import Any

from aioworker.api.choices import Choice
from aioworker.api.logprob_format import TokenTexts, chat_logprobs, completion_logprobs
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

    def chunk_choice(
        self, choice: Choice, delta: str, out: RequestOutput, is_first: bool
    ) -> dict[str, Any]:
        prefix = self._echoed(choice) if is_first else ""
        logprobs = None
        if out.logprobs is not None or (is_first and out.prompt_logprobs is not None):
            offset = len(choice.text) - len(delta) + len(self._echoed(choice))
            prompt = self._prompt(choice) if is_first else None
            logprobs = completion_logprobs(out.logprobs or [], self.texts, offset, prompt)
        return {
            "index": choice.index,
            "text": prefix + delta,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }

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

    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts

    def full_choice(self, choice: Choice) -> dict[str, Any]:
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": choice.text},
            "logprobs": chat_logprobs(choice.logprobs, self.texts) if choice.logprobs else None,
            "finish_reason": choice.finish_reason,
        }

    def chunk_choice(
        self, choice: Choice, delta: str, out: RequestOutput, is_first: bool
    ) -> dict[str, Any]:
        return {
            "index": choice.index,
            "delta": {"content": delta} if delta else {},
            "logprobs": chat_logprobs(out.logprobs, self.texts) if out.logprobs else None,
            "finish_reason": choice.finish_reason,
        }

    def opening(self, choice: Choice) -> dict[str, Any] | None:
        """Chat streams open each choice with the assistant's role."""
        return {
            "index": choice.index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
