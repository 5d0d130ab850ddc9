"""The default body bound admits a long-context prompt in every form a client sends it, while
bounding what one request may make the server hold."""

from __future__ import annotations

import json

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.config import ApiOptions

# A long context of today's models.
MAX_MODEL_LEN = 131072


def test_the_default_bound_admits_a_max_model_len_prompt_in_every_form(embedded_model_dir) -> None:
    tokenizer = Tokenizer(embedded_model_dir)
    bound = ApiOptions().max_body_bytes

    def json_size(token_id: int) -> int:
        return len(json.dumps(tokenizer.decode([token_id], skip_special_tokens=False)))

    # The prompt that costs most as JSON: the vocabulary's most expensive token, repeated.
    costliest = max(range(tokenizer.vocab_size), key=json_size)
    text = tokenizer.decode([costliest], skip_special_tokens=False) * MAX_MODEL_LEN
    largest_id = tokenizer.vocab_size - 1
    bodies = {
        "text": {"model": "m", "prompt": text},
        "token ids": {"model": "m", "prompt": [largest_id] * MAX_MODEL_LEN},
        "chat": {"model": "m", "messages": [{"role": "user", "content": text}]},
    }
    for form, body in bodies.items():
        size = len(json.dumps(body).encode())
        assert size < bound, f"a {MAX_MODEL_LEN}-token prompt as {form} is {size} bytes"
    assert bound <= 64 << 20  # and one request holds at most this much of the server's memory
