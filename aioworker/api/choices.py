"""One choice of a request as its outputs arrive: its text, cut at a stop string exactly where
the worker cut it (the same OutputText over the same tokens), its token count and logprobs."""

from __future__ import annotations

from aioworker.api.prompts import Prompt
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.output_text import OutputText
from aioworker.core.outputs import FinishReason, RequestOutput, TokenLogprobs


class Choice:
    def __init__(self, index: int, prompt: Prompt, tokenizer: Tokenizer, stop: tuple[str, ...]):
        self.index = index
        self.prompt = prompt
        self._text = OutputText(tokenizer, stop)
        self.text = ""
        self.num_tokens = 0
        # Speculative decoding: drafts verified for this choice, and accepted.
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.logprobs: list[TokenLogprobs] = []
        self.prompt_logprobs: list[TokenLogprobs] | None = None
        self.finish_reason: str | None = None

    def add(self, out: RequestOutput) -> str:
        """The text this output adds (everything held back, at the end)."""
        self.num_tokens += len(out.token_ids)
        if out.num_draft_tokens:
            self.num_draft_tokens += out.num_draft_tokens
            self.num_accepted_tokens += out.num_accepted_tokens
        delta = self._text.add(out.token_ids)
        if out.logprobs:
            self.logprobs += out.logprobs
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        if out.finished:
            delta += self._text.finish()
            self.finish_reason = "length" if out.finish_reason == FinishReason.LENGTH else "stop"
        self.text += delta
        return delta
