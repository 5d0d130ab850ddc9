"""`aioworker api`: the OpenAI-compatible HTTP server in front of running worker groups.

It reads the same configuration as the workers (--config, --set) to find the groups and the
model's tokenizer; it loads no weights and never imports torch."""

from __future__ import annotations

import argparse
import sys

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.cli.connect import add_connect_argument, client_for
from aioworker.config import ConfigError, WorkerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    http = parser.add_argument_group("HTTP")
    http.add_argument(
        "--host", help="address to listen on (default: api.host, 127.0.0.1; no auth here)"
    )
    http.add_argument(
        "--port", type=int, help="tcp port (default: api.port, 8000; 0: any free port, printed)"
    )
    http.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the `model` clients give (default: api.served_model_name, else model.path's name)",
    )
    add_connect_argument(parser, "the worker groups to serve from (default: the config's)")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from aioworker.api.gateway import Gateway
    from aioworker.api.server import serve
    from aioworker.checkpoint.source import ModelNotFoundError
    from aioworker.checkpoint.tokenizer import TokenizerError

    try:
        config = api_config(args)
        client = client_for(args.connect, config)
        gateway = Gateway.from_config(config, client, progress=sys.stderr.isatty())
    except (ConfigError, ValueError, ModelNotFoundError, TokenizerError) as exc:
        return fail(str(exc))
    try:
        serve(gateway, config.api.host, config.api.port, args.log_level)
    except OSError as exc:  # the port is taken, or the address is not ours
        return fail(f"cannot listen on {config.api.host}:{config.api.port}: {exc}")
    return 0


def api_config(args: argparse.Namespace) -> WorkerConfig:
    options = {
        "api.host": args.host,
        "api.port": args.port,
        "api.served_model_name": args.served_model_name,
    }
    return config_from_args(args, options)
