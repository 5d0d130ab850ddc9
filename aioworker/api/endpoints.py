"""The two generating endpoints, from request body to a `Run` ready to submit: decode, check the
model, tokenize (off the event loop), make the sampling params."""

from __future__ import annotations

from dataclasses import dataclass

from aioworker.api.gateway import Gateway
from aioworker.api.params import chat_params, completion_params
from aioworker.api.prompts import chat_prompt, completion_prompts
from aioworker.api.schemas import StreamOptions, decode_chat, decode_completion
from aioworker.api.serving import Run
from aioworker.api.shapes import ChatShape, CompletionShape


@dataclass(frozen=True)
class Prepared:
    run: Run
    stream: bool
    # A last chunk with the usage; with `continuous_usage`, every chunk carries the usage so far.
    include_usage: bool = False
    continuous_usage: bool = False


async def prepare_completion(gateway: Gateway, raw: bytes, arrived: float) -> Prepared:
    """`arrived`: time.perf_counter() when the request came."""
    body = decode_completion(raw)
    gateway.check_model(body.model)
    prompts = await completion_prompts(body, gateway.tokens)
    params = await completion_params(body, gateway.tokens)
    run = Run(gateway, CompletionShape(gateway.texts, body.echo), prompts, params, arrived)
    return _prepared(run, body.stream, body.stream_options)


async def prepare_chat(gateway: Gateway, raw: bytes, arrived: float) -> Prepared:
    body = decode_chat(raw)
    gateway.check_model(body.model)
    prompt = await chat_prompt(body, gateway.tokens)
    params = await chat_params(body, prompt, gateway.tokens)
    run = Run(gateway, ChatShape(gateway.texts), [prompt], params, arrived)
    return _prepared(run, body.stream, body.stream_options)


def _prepared(run: Run, stream: bool, options: StreamOptions | None) -> Prepared:
    if options is None:
        return Prepared(run, stream)
    return Prepared(run, stream, options.include_usage, options.continuous_usage_stats)
