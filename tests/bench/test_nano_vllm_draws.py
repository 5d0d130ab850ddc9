"""W1's requests are nano-vllm's bench.py draws, call for call."""

import random

from aioworker.bench.nano_vllm_draws import NUM_SEQS, nano_vllm_draws


def test_the_draws_give_nano_vllms_published_totals() -> None:
    """nano-vllm's README reports 142,827 prompt tokens and 133,966 output tokens for its
    benchmark. Token ids drawn with randrange(10000) (W1 before 2026-12-07) gave 141,664 and
    150,245: one value fewer a draw moves every draw after it."""
    draws = nano_vllm_draws()
    assert len(draws.prompts) == len(draws.max_tokens) == NUM_SEQS
    assert sum(map(len, draws.prompts)) == 142_827
    assert sum(draws.max_tokens) == 133_966


def test_the_draws_follow_the_module_level_random_calls() -> None:
    """The same calls as bench.py makes on `random` after `seed(0)`, in its order: a prompt's
    length, its tokens, and every max_tokens after all prompts. Token id 10000 is drawn."""
    saved = random.getstate()
    try:
        random.seed(0)
        prompts = [
            [random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)
        ]
        max_tokens = [random.randint(100, 1024) for _ in range(256)]
    finally:
        random.setstate(saved)
    draws = nano_vllm_draws()
    assert draws.prompts == prompts and draws.max_tokens == max_tokens
    assert max(max(p) for p in draws.prompts) == 10000
