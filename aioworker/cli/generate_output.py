"""How `aioworker generate` shows results, offline or remote: one prompt streams to the terminal,
several print as blocks when each finishes, and --json prints one object per prompt at the end."""

from __future__ import annotations

import json
import sys

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.detokenizer import IncrementalDetokenizer


class ResultPrinter:
    def __init__(self, tokenizer: Tokenizer | None, prompts: list, as_json: bool) -> None:
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.as_json = as_json
        self.token_ids: list[list[int]] = [[] for _ in prompts]
        self.reasons: list[str | None] = [None] * len(prompts)
        self.errors: list[str | None] = [None] * len(prompts)
        self.stream_live = not as_json and len(prompts) == 1 and tokenizer is not None
        self._detokenizer = IncrementalDetokenizer(tokenizer) if self.stream_live else None
        self._streamed = ""

    def add(
        self, index: int, token_ids: list[int], finish_reason: str | None, error: str | None = None
    ) -> None:
        self.token_ids[index] += token_ids
        if self._detokenizer is not None and token_ids:
            delta = self._detokenizer.add(token_ids)
            self._streamed += delta
            sys.stdout.write(delta)
            sys.stdout.flush()
        if finish_reason is None:
            return
        self.reasons[index], self.errors[index] = finish_reason, error
        if error:
            print(f"aioworker: prompt {index} ended ({finish_reason}): {error}", file=sys.stderr)
        if not self.stream_live and not self.as_json:
            print(f"--- prompt {index} ---\n{self.text(index)}", flush=True)

    def text(self, index: int) -> str | None:
        return self.tokenizer.decode(self.token_ids[index]) if self.tokenizer else None

    def finish(self) -> int:
        """Print what remains; returns the exit code (1 if any request failed)."""
        if self.stream_live:
            # The detokenizer holds back incomplete UTF-8; print whatever it still holds.
            sys.stdout.write((self.text(0) or "")[len(self._streamed) :] + "\n")
        if self.as_json:
            for index, prompt in enumerate(self.prompts):
                record = {
                    "index": index,
                    "prompt": prompt,
                    "token_ids": self.token_ids[index],
                    "text": self.text(index),
                    "finish_reason": self.reasons[index],
                }
                if self.errors[index]:
                    record["error"] = self.errors[index]
                print(json.dumps(record, ensure_ascii=False))
        return 1 if any(reason == "error" for reason in self.reasons) else 0
