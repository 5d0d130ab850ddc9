"""Rebuild a Hugging Face `tokenizers` tokenizer (and tokenizer_config.json) from GGUF metadata.

Supports byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`), which is what Llama-3,
Qwen2/3 and SmolLM GGUF files carry. The pre-tokenizer follows `tokenizer.ggml.pre`.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

_CONTROL, _USER_DEFINED = 3, 4

_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level_split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in ("smollm", "starcoder", "refact"):
        # Digits one by one, then GPT-2's byte-level split.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        return _byte_level_split(_LLAMA3_PATTERN)
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return _byte_level_split(_QWEN2_PATTERN)
    if pre in (None, "default", "gpt-2", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise ValueError(
        f"GGUF pre-tokenizer {pre!r} is not supported; supported: smollm, starcoder, llama-bpe, "
        "qwen2, gpt-2"
    )


def build_tokenizer(meta, model_max_length: int) -> tuple[Tokenizer, dict[str, Any]]:
    """Return the tokenizer and the contents of tokenizer_config.json."""
    kind = meta.require("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "convert the original Hugging Face checkpoint instead"
        )
    tokens: list[str] = list(meta.require("tokenizer.ggml.tokens"))
    token_types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.require("tokenizer.ggml.merges")]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens(
        [
            AddedToken(t, normalized=False)
            for t, kind in zip(tokens, token_types, strict=True)
            if kind == _USER_DEFINED
        ]
    )
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, token_types, strict=True)
            if kind == _CONTROL
        ]
    )
    bos = _token(tokens, meta.get("tokenizer.ggml.bos_token_id"))
    eos = _token(tokens, meta.get("tokenizer.ggml.eos_token_id"))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    tokenizer.post_processor = _post_processor(
        add_bos, bos, meta.get("tokenizer.ggml.bos_token_id")
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": _token(tokens, meta.get("tokenizer.ggml.padding_token_id")),
        "unk_token": _token(tokens, meta.get("tokenizer.ggml.unknown_token_id")),
        "add_bos_token": add_bos,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return tokenizer, config


def _post_processor(add_bos: bool, bos: str | None, bos_id: int | None):
    byte_level = processors.ByteLevel(trim_offsets=False)
    if not add_bos:
        return byte_level
    template = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0",
        pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
        special_tokens=[(bos, int(bos_id))],
    )
    return processors.Sequence([byte_level, template])


def _token(tokens: list[str], index: int | None) -> str | None:
    return None if index is None or not 0 <= int(index) < len(tokens) else tokens[int(index)]
