from __future__ import annotations

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.detokenizer import IncrementalDetokenizer


def test_chat_template_matches_transformers(embedded_model_dir) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(embedded_model_dir)
    ours = Tokenizer(embedded_model_dir)
    messages = [{"role": "user", "content": "Hi there"}]
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours.apply_chat_template(messages) == expected
    assert (
        ours.encode_chat(messages)
        == reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )


def test_incremental_detokenizer_never_splits_characters(embedded_model_dir) -> None:
    tokenizer = Tokenizer(embedded_model_dir)
    text = "Grüße 日本語 🎉🎉 done."
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.add([t]) for t in token_ids]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert sum(1 for d in deltas if d) < len(token_ids)  # multi-token characters were held back
