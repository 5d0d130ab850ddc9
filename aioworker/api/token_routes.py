"""POST /tokenize and /detokenize, as vLLM answers them (scripts count a prompt's tokens before
sending it): a prompt, or chat messages through the template, to `count`, `max_model_len` and
`tokens`; token ids back to text. Both tokenize off the event loop."""

from __future__ import annotations

from typing import Any

from aioworker.api.errors import invalid
from aioworker.api.gateway import Gateway
from aioworker.api.prompts import template_messages
from aioworker.api.schemas import decode_detokenize, decode_tokenize


async def tokenize(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    body = decode_tokenize(raw)
    gateway.check_model(body.model)
    tokens = gateway.tokens
    if body.prompt is not None:
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        token_ids = await tokens.encode(body.prompt, "prompt", add_special)
    else:
        assert body.messages is not None
        messages = template_messages(body.messages, None, gateway.tokenizer.takes_tools)
        add_special = bool(body.add_special_tokens)  # the template writes them
        token_ids = await tokens.encode_chat(
            messages, "messages", body.add_generation_prompt, add_special
        )
    texts = [gateway.texts[t] for t in token_ids] if body.return_token_strs else None
    return {
        "count": len(token_ids),
        "max_model_len": gateway.max_model_len,
        "tokens": token_ids,
        "token_strs": texts,
    }


async def detokenize(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    body = decode_detokenize(raw)
    gateway.check_model(body.model)
    if len(body.tokens) > gateway.max_model_len:
        raise invalid(
            f"tokens has {len(body.tokens)} ids; a sequence of this model has at most "
            f"max_model_len ({gateway.max_model_len})",
            "tokens",
        )
    gateway.tokens.check_token_ids(body.tokens, "tokens")
    return {"prompt": await gateway.tokens.decode(body.tokens)}
