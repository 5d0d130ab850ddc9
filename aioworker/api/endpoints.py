"""The two generating endpoints, from request body to a `Run` ready to submit: decode, check the
model, tokenize, make the sampling params."""

from __future__ import annotations

from dataclasses import dataclass

from aioworker.api.gateway import Gateway
from aioworker.api.prompts import chat_params, chat_prompt, completion_params, completion_prompts
from aioworker.api.schemas import decode_chat, decode_completion
from aioworker.api.serving import Run
from aioworker.api.shapes import ChatShape, CompletionShape


@dataclass
class Prepared:
    run: Run
    stream: bool
    include_usage: bool


def prepare_completion(gateway: Gateway, raw: bytes) -> Prepared:
    body = decode_completion(raw)
    gateway.check_model(body.model)
    params = completion_params(body)
    prompts = completion_prompts(body, gateway.tokenizer)
    run = Run(gateway, CompletionShape(gateway.texts, body.echo), prompts, params)
    return Prepared(run, body.stream, _include_usage(body.stream_options))


def prepare_chat(gateway: Gateway, raw: bytes) -> Prepared:
    body = decode_chat(raw)
    gateway.check_model(body.model)
    prompt = chat_prompt(body, gateway.tokenizer)
    params = chat_params(body, prompt, gateway.max_model_len)
    run = Run(gateway, ChatShape(gateway.texts), [prompt], params)
    return Prepared(run, body.stream, _include_usage(body.stream_options))


def _include_usage(options) -> bool:
    return options is not None and options.include_usage
