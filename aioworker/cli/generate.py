"""`aioworker generate`: run prompts through the offline engine in this process.

Streams text to the terminal, or prints one JSON object per prompt with --json.
"""

from __future__ import annotations

import argparse
import json
import sys

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.cli.connect import add_connect_argument
from aioworker.cli.generate_output import ResultPrinter
from aioworker.cli.generate_sampling import add_sampling_arguments, sampling_params
from aioworker.config import ConfigError
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_prompt_arguments(parser)
    add_sampling_arguments(parser)
    _add_output_arguments(parser)
    remote = parser.add_argument_group("remote (a running deployment instead of this process)")
    add_connect_argument(remote, "send the prompts to a running deployment")
    remote.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="remote only: seconds each request may take; the workers abort it then (default 600)",
    )
    add_config_arguments(parser)


def _add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    prompts = parser.add_argument_group("prompts")
    prompts.add_argument(
        "--prompt", action="append", default=[], metavar="TEXT", help="a text prompt (repeatable)"
    )
    prompts.add_argument(
        "--chat", action="store_true", help="wrap each --prompt in the model's chat template"
    )
    prompts.add_argument(
        "--prompt-token-ids",
        metavar="JSON",
        help="token-id prompts as JSON: [1, 2, 3] for one, [[1, 2], [3, 4]] for several (after any --prompt)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    output.add_argument(
        "--logprobs",
        type=int,
        metavar="K",
        help="with --json: each generated token's logprob and its K likeliest alternatives (0-20)",
    )
    output.add_argument(
        "--prompt-logprobs",
        type=int,
        metavar="K",
        help="with --json: the same for every prompt token after the first",
    )


def run(args: argparse.Namespace) -> int:
    try:
        prompts = _prompts(args)
        config = config_from_args(args)
        params = sampling_params(args, config)
        if not args.json and (args.logprobs is not None or args.prompt_logprobs is not None):
            raise ValueError("--logprobs and --prompt-logprobs show only with --json; add it")
        if not 0 < args.timeout <= 7 * 86400:
            raise ValueError(f"--timeout {args.timeout:g}: give seconds, more than 0, up to a week")
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    if args.connect is not None:
        from aioworker.cli.generate_remote import run_remote

        return run_remote(args, config, prompts, params)
    return _run_offline(args, config, prompts, params)


def _run_offline(args, config, prompts: list, params: SamplingParams) -> int:
    from aioworker.engine import LLMEngine  # torch enters here

    try:
        engine = LLMEngine.from_config(config, progress=sys.stderr.isatty())
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    with engine:
        try:
            request_ids = [
                engine.add_request(_encode(engine, p, args.chat), params) for p in prompts
            ]
        except (InvalidRequestError, ValueError) as exc:
            return fail(str(exc))
        printer = ResultPrinter(engine.tokenizer, prompts, args.json, params.stop)
        index_of = {rid: index for index, rid in enumerate(request_ids)}
        for out in engine.stream():
            printer.add(index_of[out.request_id], out)
        return printer.finish()


def _prompts(args: argparse.Namespace) -> list[str | list[int]]:
    prompts: list[str | list[int]] = list(args.prompt)
    if args.prompt_token_ids:
        try:
            parsed = json.loads(args.prompt_token_ids)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--prompt-token-ids is not valid JSON: {exc}") from exc
        if isinstance(parsed, list) and parsed and all(isinstance(t, int) for t in parsed):
            parsed = [parsed]
        if not (
            isinstance(parsed, list)
            and all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in parsed)
        ):
            raise ValueError("--prompt-token-ids must be a list of ints or a list of lists of ints")
        prompts += parsed
    if not prompts:
        raise ValueError("give at least one --prompt TEXT or --prompt-token-ids JSON")
    return prompts


def _encode(engine, prompt: str | list[int], chat: bool) -> list[int]:
    return engine.encode(prompt, chat=chat) if isinstance(prompt, str) else prompt
