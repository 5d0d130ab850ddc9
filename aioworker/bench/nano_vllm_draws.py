"""W1's requests: the draws of nano-vllm's bench.py, call for call.

nano-vllm seeds Python's `random` with 0 and draws, in this order: for each of 256 sequences
its prompt length `randint(100, 1024)`, then that many token ids `randint(0, 10000)` (both ends
included), then each sequence's `max_tokens` `randint(100, 1024)`. Its README reports the
totals these give: 142,827 prompt tokens and 133,966 output tokens. A draw made any other way
(`randrange(10000)`, one value fewer) changes every later draw, and with them the workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NUM_SEQS = 256
MAX_INPUT_LEN = 1024
MAX_OUTPUT_LEN = 1024
MIN_LEN = 100
MAX_TOKEN_ID = 10000  # randint's upper end, included


@dataclass(frozen=True)
class Draws:
    prompts: list[list[int]]
    max_tokens: list[int]


def nano_vllm_draws(seed: int = 0) -> Draws:
    rng = random.Random(seed)  # the same stream as nano-vllm's module-level random.seed(0)
    prompts = [
        [rng.randint(0, MAX_TOKEN_ID) for _ in range(rng.randint(MIN_LEN, MAX_INPUT_LEN))]
        for _ in range(NUM_SEQS)
    ]
    max_tokens = [rng.randint(MIN_LEN, MAX_OUTPUT_LEN) for _ in range(NUM_SEQS)]
    return Draws(prompts, max_tokens)
