"""The two generating endpoints, from request body to a `Run` ready to submit: decode, check the
model, read the constraint and the tools, tokenize (off the event loop), make the sampling
params."""

from __future__ import annotations

from dataclasses import dataclass

from aioworker.api.gateway import Gateway
from aioworker.api.guidance import request_guidance
from aioworker.api.params import chat_params, completion_params
from aioworker.api.prompts import chat_prompt, completion_prompts
from aioworker.api.schemas import StreamOptions, decode_chat, decode_completion
from aioworker.api.serving import Run
from aioworker.api.shapes import ChatShape, CompletionShape
from aioworker.api.tool_calls import parser_for
from aioworker.api.tool_outputs import reader_factory
from aioworker.api.tools import chat_tools


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
    guidance = request_guidance(body)
    prompts = await completion_prompts(body, gateway.tokens)
    params = await completion_params(body, gateway.tokens, guidance)
    shape = CompletionShape(gateway.texts, body.echo)
    run = Run(gateway, shape, prompts, params, arrived, guidance)
    return _prepared(run, body.stream, body.stream_options)


async def prepare_chat(gateway: Gateway, raw: bytes, arrived: float) -> Prepared:
    body = decode_chat(raw)
    gateway.check_model(body.model)
    tools = chat_tools(body)
    guidance = request_guidance(body, tools.guidance if tools else None)
    prompt = await chat_prompt(body, gateway.tokens, tools.tools if tools else None)
    params = await chat_params(body, prompt, gateway.tokens, guidance)
    tokenizer = gateway.tokenizer
    parser = parser_for(tokenizer.chat_template, tokenizer.takes_tools)
    shape = ChatShape(gateway.texts, reader_factory(tools, parser))
    run = Run(gateway, shape, [prompt], params, arrived, guidance)
    return _prepared(run, body.stream, body.stream_options)


def _prepared(run: Run, stream: bool, options: StreamOptions | None) -> Prepared:
    if options is None:
        return Prepared(run, stream)
    return Prepared(run, stream, options.include_usage, options.continuous_usage_stats)
