"""Tokenizing for the routes: a text too long to fit is refused by its length alone, at the
exact bound the tokenizer gives, and tokenizing runs on the pool's threads, with the GIL
released, so the event loop goes on while a long text is tokenized."""

from __future__ import annotations

import asyncio
import time

import pytest

from aioworker.api.errors import ApiError
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.checkpoint.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir) -> Tokenizer:
    return Tokenizer(embedded_model_dir)


def test_the_character_cap_is_max_model_len_times_the_longest_vocabulary_entry(tokenizer) -> None:
    vocab = tokenizer._tokenizer.get_vocab(with_added_tokens=True)
    longest = max(vocab, key=len)
    tokens = PromptTokenizer(tokenizer, 3, tokenizer.vocab_size, 1)
    try:
        # The longest entry three times is a text of 3 * L characters in 3 tokens: it fits, so
        # no smaller cap is right, and one character more cannot fit.
        text = tokenizer.decode([vocab[longest]] * 3, skip_special_tokens=False)
        assert len(text) <= 3 * tokens.chars_per_token == 3 * len(longest)
        assert len(asyncio.run(tokens.encode(text, "prompt", add_special_tokens=False))) <= 3
        calls = []
        tokenizer_encode = tokens.tokenizer.encode_unlocked
        tokens.tokenizer.encode_unlocked = lambda *a: calls.append(a) or tokenizer_encode(*a)
        with pytest.raises(ApiError) as caught:
            asyncio.run(tokens.encode("a" * (3 * len(longest) + 1), "prompt"))
        assert calls == [], "a text over the cap must be refused without tokenizing"
        assert caught.value.param == "prompt" and "more than 3 tokens" in caught.value.message
    finally:
        del tokens.tokenizer.encode_unlocked
        tokens.close()


def test_tokenizing_leaves_the_event_loop_free(tokenizer) -> None:
    tokens = PromptTokenizer(tokenizer, 10**7, tokenizer.vocab_size, 1)
    text = "hello world, this is a test. " * 100_000  # about a second of tokenizing

    async def main() -> float:
        encoding = asyncio.ensure_future(tokens.encode(text, "prompt"))
        longest_gap, last = 0.0, time.perf_counter()
        while not encoding.done():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            longest_gap, last = max(longest_gap, now - last), now
        assert len(await encoding) > 500_000
        return longest_gap

    try:
        longest_gap = asyncio.run(main())
    finally:
        tokens.close()
    # With encode() on the loop's thread (or holding the GIL) the loop stops for the whole
    # tokenizing; here it wakes every few milliseconds.
    assert longest_gap < 0.25, longest_gap
