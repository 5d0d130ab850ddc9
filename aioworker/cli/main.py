"""`aioworker` entry point. Subcommands load lazily so control-plane tools start fast (no torch)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module under aioworker.cli, one-line help)
SUBCOMMANDS = {
    "serve": ("serve", "start every local rank of a deployment and supervise them"),
    "worker": ("worker", "run exactly one rank (what a systemd unit runs)"),
    "api": ("api", "the OpenAI-compatible HTTP server in front of running worker groups"),
    "generate": ("generate", "generate text from prompts, offline or from a running deployment"),
    "admin": ("admin", "control a running worker group: status, pause, drain, abort, ..."),
    "top": ("top", "live table of every rank, from their heartbeats"),
    "convert": ("convert", "convert a GGUF file into a Hugging Face model directory"),
    "bench": ("bench", "benchmark the engine beside a baseline measured in the same run"),
    "keys": ("keys", "write CURVE key pairs (server and client) for a tcp deployment"),
    "replay": ("replay", "run a recorded task channel again and compare the outputs"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aioworker",
        description="aioworker: the per-rank worker of an LLM inference service.",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(f"aioworker.cli.{module_name}")
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
