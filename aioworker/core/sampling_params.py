"""What a client asks for when it submits a request: sampling and stopping parameters.

A msgspec Struct so it can travel on the wire unchanged; `validate` names the bad field and its limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from aioworker.core.guided import GuidedParams
from aioworker.core.request_errors import InvalidRequestError

# The smallest temperature that is sampled as asked; below it, greedy (see is_greedy).
GREEDY_BELOW = 1e-5
# The most alternatives a request may ask logprobs for, per token (OpenAI's top_logprobs bound).
MAX_LOGPROBS = 20
# Stop strings: how many a request may give, and how long each may be (characters).
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LENGTH = 256
# The most samples one request may ask for (`n`).
MAX_SAMPLES = 64
# OpenAI's bounds on presence_penalty and frequency_penalty, and on each logit_bias value.
MAX_ABS_PENALTY = 2.0
MAX_ABS_LOGIT_BIAS = 100.0
# How many entries logit_bias, allowed_token_ids and bad_words_token_ids may hold, and how many
# tokens one bad word may have: bounds on the per-request work of every step.
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_ALLOWED_TOKEN_IDS = 65536
MAX_BAD_WORDS = 128
MAX_BAD_WORD_TOKENS = 16


class SamplingParams(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    max_tokens: int = 16
    min_tokens: int = 0
    # 0 = greedy.
    temperature: float = 1.0
    # 0 = no top-k cut.
    top_k: int = 0
    top_p: float = 1.0
    # A seeded request samples the same tokens whatever else shares its batch.
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Text that ends the request where it appears in the output (never included in it); needs
    # the model's tokenizer in the worker.
    stop: tuple[str, ...] = ()
    # Each sampled token's logprob, with this many most likely alternatives (0..MAX_LOGPROBS).
    logprobs: int | None = None
    # The same for every prompt token after the first (RL scoring).
    prompt_logprobs: int | None = None
    # Independent samples of the same prompt, which is computed once and shared; sample i is
    # seeded with seed + i and has its own outputs (`sample_index`) and terminal output.
    n: int = 1
    # Penalties on tokens already seen. repetition_penalty > 0 (1 = off) divides the positive
    # logits, and multiplies the negative ones, of every token in the prompt or the output
    # (CTRL's rule, as vLLM and transformers apply it). presence_penalty and frequency_penalty
    # (-2..2, 0 = off) subtract from the logit of every token in the output: once, and once per
    # time it appeared (OpenAI's rule).
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Drops tokens whose probability is below min_p times the likeliest token's (0 = off).
    min_p: float = 0.0
    # Added to the logits of these token ids (-100..100), before penalties and temperature.
    logit_bias: dict[int, float] = {}
    # Only these token ids may be sampled (None = any).
    allowed_token_ids: tuple[int, ...] | None = None
    # Token sequences never generated: the last token of each is banned wherever the output
    # ends with the others (a one-token word is banned everywhere).
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # What the output must match (core/guided.py): a JSON schema, a regex, a grammar, a choice.
    # Steps mask every token that would break it; a grammar that completes ends the output.
    guided: GuidedParams | None = None

    def validate(self) -> None:
        """Check the fields that need no model; token ids are checked against the vocabulary at admission."""
        if self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens is {self.max_tokens}; it must be at least 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens is {self.min_tokens}; it must be between 0 and max_tokens ({self.max_tokens})"
            )
        if not 0.0 <= self.temperature < math.inf:  # also rejects NaN
            raise InvalidRequestError(
                f"temperature is {self.temperature}; it must be finite and >= 0 (0 means greedy)"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p is {self.top_p}; it must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k is {self.top_k}; it must be >= 0 (0 disables it)")
        if not 1 <= self.n <= MAX_SAMPLES:
            raise InvalidRequestError(f"n is {self.n}; it must be between 1 and {MAX_SAMPLES}")
        if self.seed is not None and not 0 <= self.seed <= 2**63 - self.n:
            raise InvalidRequestError(f"seed is {self.seed}; seed + n must stay below 2**63")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise InvalidRequestError(
                    f"{name} is {value}; it must be between 0 and {MAX_LOGPROBS}"
                )
        self._validate_stop()
        self._validate_logits_controls()
        if self.guided is not None:
            self.guided.validate()

    def _validate_logits_controls(self) -> None:
        if not 0.0 < self.repetition_penalty < math.inf:
            raise InvalidRequestError(
                f"repetition_penalty is {self.repetition_penalty}; it must be finite and > 0 "
                "(1 disables it)"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_ABS_PENALTY <= value <= MAX_ABS_PENALTY:
                raise InvalidRequestError(
                    f"{name} is {value}; it must be between -{MAX_ABS_PENALTY:g} and "
                    f"{MAX_ABS_PENALTY:g} (0 disables it)"
                )
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(
                f"min_p is {self.min_p}; it must be in [0, 1] (0 disables it)"
            )
        self._validate_token_controls()

    def _validate_token_controls(self) -> None:
        """logit_bias, allowed_token_ids and bad words: their sizes bound each step's work."""
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidRequestError(
                f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} "
                "are allowed"
            )
        for token_id, bias in self.logit_bias.items():
            if not -MAX_ABS_LOGIT_BIAS <= bias <= MAX_ABS_LOGIT_BIAS:
                raise InvalidRequestError(
                    f"logit_bias for token {token_id} is {bias}; each value must be between "
                    f"-{MAX_ABS_LOGIT_BIAS:g} and {MAX_ABS_LOGIT_BIAS:g}"
                )
        if self.allowed_token_ids is not None and not (
            0 < len(self.allowed_token_ids) <= MAX_ALLOWED_TOKEN_IDS
        ):
            raise InvalidRequestError(
                f"allowed_token_ids has {len(self.allowed_token_ids)} ids; give 1 to "
                f"{MAX_ALLOWED_TOKEN_IDS} (or leave it out to allow any token)"
            )
        if len(self.bad_words_token_ids) > MAX_BAD_WORDS:
            raise InvalidRequestError(
                f"bad_words has {len(self.bad_words_token_ids)} entries; at most {MAX_BAD_WORDS} "
                "are allowed"
            )
        for word in self.bad_words_token_ids:
            if not 0 < len(word) <= MAX_BAD_WORD_TOKENS:
                raise InvalidRequestError(
                    f"a bad word has {len(word)} tokens; each must have 1 to {MAX_BAD_WORD_TOKENS}"
                )
        banned = {word[0] for word in self.bad_words_token_ids if len(word) == 1}
        if self.allowed_token_ids is not None and banned.issuperset(self.allowed_token_ids):
            raise InvalidRequestError(
                "every token of allowed_token_ids is also a bad word, so none could be sampled; "
                "allow another token or drop a bad word"
            )

    def token_ids_to_check(self) -> list[tuple[str, list[int]]]:
        """Every token id the request names, by field, for the vocabulary check at admission."""
        fields = [("stop_token_ids", list(self.stop_token_ids))]
        fields.append(("logit_bias", list(self.logit_bias)))
        fields.append(("allowed_token_ids", list(self.allowed_token_ids or ())))
        fields.append(("bad_words", [t for word in self.bad_words_token_ids for t in word]))
        return fields

    def _validate_stop(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS} are allowed"
            )
        for text in self.stop:
            if not 0 < len(text) <= MAX_STOP_STRING_LENGTH:
                raise InvalidRequestError(
                    f"stop string {text[:40]!r} has {len(text)} characters; each must have 1 to "
                    f"{MAX_STOP_STRING_LENGTH}"
                )

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample greedily: dividing float32 logits by them
        overflows, and the distribution they ask for is the argmax anyway."""
        return self.temperature < GREEDY_BELOW


def bad_words_token_ids(
    encode: Callable[[str], list[int]], words: list[str]
) -> tuple[tuple[int, ...], ...]:
    """`bad_words_token_ids` for words given as text: each word as written and after a space,
    since a BPE vocabulary spells a word differently inside a sentence (" York") than at its
    start ("York"). `encode`: text -> token ids, without special tokens."""
    found: dict[tuple[int, ...], None] = {}
    for word in words:
        if not word.strip():
            raise InvalidRequestError("a bad word is empty; give some text")
        for text in (word, " " + word):
            token_ids = tuple(encode(text))
            if token_ids:
                found[token_ids] = None
    return tuple(found)
