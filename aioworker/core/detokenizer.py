"""Token ids streamed one step at a time -> text deltas, never splitting a multi-byte character.

Works with any tokenizer that can decode a list of ids (checkpoint.tokenizer.Tokenizer): decoding
a short window of recent tokens, rather than each token alone, keeps the spaces and merged
characters that only a neighbouring token decides.
"""

from __future__ import annotations

from typing import Protocol


class Decodes(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Emits new text once it no longer ends in an incomplete UTF-8 sequence (which tokenizers
    show as U+FFFD)."""

    def __init__(self, tokenizer: Decodes, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        decode = self.tokenizer.decode
        prefix = decode(
            self.token_ids[self._prefix_offset : self._read_offset], self.skip_special_tokens
        )
        full = decode(self.token_ids[self._prefix_offset :], self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        return full[len(prefix) :]
