"""`aioworker generate`: run prompts through the offline engine in this process.

Streams text to the terminal, or prints one JSON object per prompt with --json.
"""

from __future__ import annotations

import argparse
import json
import sys

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.config import ConfigError
from aioworker.sampling_params import InvalidRequestError, SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument(
        "--max-tokens", type=int, default=128, help="tokens to generate per prompt (default 128)"
    )
    sampling.add_argument(
        "--min-tokens", type=int, default=0, help="tokens before a stop token may end it"
    )
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    sampling.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]"
    )
    sampling.add_argument(
        "--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = all"
    )
    sampling.add_argument(
        "--seed", type=int, help="per-request seed: same tokens whatever the batch"
    )
    sampling.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at the model's EOS token"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        prompts = _prompts(args)
        params = SamplingParams(
            max_tokens=args.max_tokens,
            min_tokens=args.min_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
        )
        params.validate()  # before the model loads, so a typo fails fast
        config = config_from_args(args)
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
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
        _print_results(engine, request_ids, prompts, args.json)
    return 0


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


def _print_results(engine, request_ids: list[str], prompts: list, as_json: bool) -> None:
    token_ids: dict[str, list[int]] = {rid: [] for rid in request_ids}
    reasons: dict[str, str] = {}
    stream_live = not as_json and len(request_ids) == 1
    streamed = ""
    for out in engine.stream():
        token_ids[out.request_id] += out.new_token_ids
        if stream_live:
            streamed += out.text
            sys.stdout.write(out.text)
            sys.stdout.flush()
        if out.finish_reason is not None:
            reasons[out.request_id] = str(out.finish_reason)
            if not stream_live and not as_json:
                _print_block(engine, request_ids.index(out.request_id), token_ids[out.request_id])
    if stream_live:
        # The detokenizer holds back incomplete UTF-8; print whatever it still holds.
        full = engine.tokenizer.decode(token_ids[request_ids[0]]) if engine.tokenizer else ""
        sys.stdout.write(full[len(streamed) :] + "\n")
    if as_json:
        for index, rid in enumerate(request_ids):
            record = {
                "index": index,
                "prompt": prompts[index],
                "token_ids": token_ids[rid],
                "text": engine.tokenizer.decode(token_ids[rid]) if engine.tokenizer else None,
                "finish_reason": reasons.get(rid),
            }
            print(json.dumps(record, ensure_ascii=False))


def _print_block(engine, index: int, token_ids: list[int]) -> None:
    text = engine.tokenizer.decode(token_ids) if engine.tokenizer else str(token_ids)
    print(f"--- prompt {index} ---\n{text}", flush=True)
