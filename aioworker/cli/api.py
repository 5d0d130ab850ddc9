"""`aioworker api`: the OpenAI-compatible HTTP server in front of running worker groups.

It reads the same configuration as the workers (--config, --set) to find the groups and the
model's tokenizer; it loads no weights and never imports torch."""

from __future__ import annotations

import argparse
import os
import sys

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.cli.connect import add_connect_argument, client_for
from aioworker.config import ConfigError, WorkerConfig

API_KEY_VARIABLE = "AIOWORKER_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    http = parser.add_argument_group("HTTP")
    http.add_argument("--host", help="address to listen on (default: api.host, 127.0.0.1)")
    http.add_argument(
        "--port", type=int, help="tcp port (default: api.port, 8000; 0: any free port, printed)"
    )
    add_api_arguments(http)
    add_connect_argument(parser, "the worker groups to serve from (default: the config's)")
    add_config_arguments(parser)


def add_api_arguments(group: argparse._ActionsContainer) -> None:
    """The flags `aioworker serve` takes too and passes on to its HTTP server."""
    group.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help="the `model` names clients may give; answers carry the first (default: "
        "api.served_model_name, else model.path's last part)",
    )
    group.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"ask every route but /health for `Authorization: Bearer KEY` (default: "
        f"${API_KEY_VARIABLE}, else api.api_key; the environment keeps it out of `ps`)",
    )
    group.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template to use instead of the model's (default: api.chat_template)",
    )


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
        "api.api_key": args.api_key or os.environ.get(API_KEY_VARIABLE) or None,
        "api.chat_template": args.chat_template,
    }
    return config_from_args(args, options)
