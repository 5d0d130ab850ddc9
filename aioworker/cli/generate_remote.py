"""`aioworker generate --connect`: the same prompts and output, served by a running deployment
through the client library. Tokenizes and detokenizes here; the workers see token ids only."""

from __future__ import annotations

import asyncio
import sys

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.cli.common import fail
from aioworker.cli.connect import client_for
from aioworker.cli.generate_output import ResultPrinter
from aioworker.config import WorkerConfig
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client

# The workers end the requests at --timeout; this process waits a little longer for their word.
DEADLINE_SLACK_S = 5.0


def run_remote(args, config: WorkerConfig, prompts: list, params: SamplingParams) -> int:
    tokenizer = load_tokenizer(config)
    try:
        token_prompts = [_encode(tokenizer, p, args.chat) for p in prompts]
        client = client_for(args.connect, config)
    except ValueError as exc:
        return fail(str(exc))
    printer = ResultPrinter(tokenizer, prompts, args.json, params.stop)
    run = _run(client, token_prompts, params, printer, args.timeout)
    try:
        asyncio.run(asyncio.wait_for(run, args.timeout + DEADLINE_SLACK_S))
    except TimeoutError:
        return fail(
            f"no complete answer within --timeout {args.timeout:g}s; is the deployment running?", 1
        )
    except KeyboardInterrupt:
        # Closing the client aborted the requests still running: nothing is left computing.
        print("\naioworker: interrupted; the requests in flight were aborted", file=sys.stderr)
        return 130
    return printer.finish()


async def _run(
    client: Client,
    prompts: list[list[int]],
    params: SamplingParams,
    printer: ResultPrinter,
    timeout_s: float,
) -> None:
    async with client:
        streams = [await client.submit(p, params, timeout_s=timeout_s) for p in prompts]

        async def consume(index: int, stream) -> None:
            async for out in stream:
                printer.add(index, out)

        await asyncio.gather(*(consume(i, s) for i, s in enumerate(streams)))


def load_tokenizer(config: WorkerConfig) -> Tokenizer | None:
    """The model's tokenizer, or None where its directory has no tokenizer.json."""
    from aioworker.checkpoint.source import resolve_model_path

    model_dir = resolve_model_path(config.model.path)
    return Tokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None


def _encode(tokenizer: Tokenizer | None, prompt, chat: bool) -> list[int]:
    if not isinstance(prompt, str):
        return prompt
    if tokenizer is None:
        raise ValueError("text prompts need the model's tokenizer.json; pass --model or token ids")
    if chat:
        return tokenizer.encode_chat([{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt)
