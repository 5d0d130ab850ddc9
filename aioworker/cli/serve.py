"""`aioworker serve`: start every rank of a deployment on this host and supervise them.

Each rank runs as `aioworker worker --rank R` with the same configuration arguments: the
`--config` path and every override are replayed to it (`--tp`/`--dp` as `--set`), and the
launcher parses exactly those arguments itself first, so a bad configuration fails here once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from aioworker.cli.api import add_api_arguments
from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.cli.launcher import ChildCommand, Launcher
from aioworker.cli.restarts import RestartPolicy
from aioworker.config import ConfigError, WorkerConfig

DEFAULT_STOP_TIMEOUT_S = 90.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tp",
        type=int,
        metavar="N",
        help="tensor-parallel ranks per group: parallel.tensor_parallel_size",
    )
    parser.add_argument(
        "--dp",
        type=int,
        metavar="M",
        help="data-parallel groups (model replicas): parallel.data_parallel_size",
    )
    parser.add_argument(
        "--fake-executor",
        action="store_true",
        help="passed to every rank: no model, made-up tokens (tests, control-plane benchmarks)",
    )
    parser.add_argument(
        "--api-port",
        type=int,
        metavar="PORT",
        help="also run the OpenAI-compatible HTTP server (`aioworker api`) on this port, under "
        "the same supervision (0: any free port, printed; its address: api.host)",
    )
    add_api_arguments(parser.add_argument_group("HTTP server (with --api-port)"))
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_S,
        metavar="SECONDS",
        help="after SIGTERM, how long ranks may drain before they are killed (default: 90)",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not hasattr(signal, "sigwaitinfo"):
        return fail(
            "aioworker serve needs Linux; elsewhere start each rank with `aioworker worker`"
        )
    if args.api_port is not None and not 0 <= args.api_port < 65536:
        return fail(f"--api-port {args.api_port}: give a tcp port (0: any free one)")
    api_only = [
        flag
        for flag, value in (
            ("--served-model-name", args.served_model_name),
            ("--api-key", args.api_key),
            ("--chat-template", args.chat_template),
        )
        if value
    ]
    if api_only and args.api_port is None:
        return fail(f"{', '.join(api_only)}: these configure the HTTP server; add --api-port PORT")
    if not args.stop_timeout >= 0:
        return fail(f"--stop-timeout {args.stop_timeout:g}: give 0 or more seconds")
    config_argv = worker_config_argv(args)
    try:
        config = parse_worker_config(config_argv)
    except ConfigError as exc:
        return fail(str(exc))
    tp = config.parallel.tensor_parallel_size
    commands = [
        ChildCommand(rank, rank // tp, worker_argv(args, rank, config_argv))
        for rank in range(config.world_size)
    ]
    if args.api_port is not None:
        commands.append(ChildCommand(-1, -1, api_argv(args, config_argv)))
    policy = RestartPolicy.from_options(config.launcher)
    return Launcher(commands, args.stop_timeout, policy).run()


def worker_config_argv(args: argparse.Namespace) -> list[str]:
    """The configuration options every rank gets, in `--option=value` form."""
    config_path = os.path.abspath(args.config) if args.config else None
    options = {
        "--config": config_path,
        "--model": args.model,
        "--max-model-len": args.max_model_len,
        "--device": args.device,
        "--dtype": args.dtype,
    }
    argv = [f"{flag}={value}" for flag, value in options.items() if value is not None]
    overrides = list(args.set)
    # Last, so they win over a --set of the same key, for the launcher and the ranks alike.
    if args.tp is not None:
        overrides.append(f"parallel.tensor_parallel_size={args.tp}")
    if args.dp is not None:
        overrides.append(f"parallel.data_parallel_size={args.dp}")
    return argv + [f"--set={item}" for item in overrides]


def parse_worker_config(config_argv: list[str]) -> WorkerConfig:
    """The configuration the ranks will build from `config_argv`, built the same way."""
    parser = argparse.ArgumentParser(prog="aioworker serve")
    add_config_arguments(parser)
    return config_from_args(parser.parse_args(config_argv))


def api_argv(args: argparse.Namespace, config_argv: list[str]) -> list[str]:
    command = [sys.executable, "-m", "aioworker.cli.main", "--log-level", args.log_level]
    command += ["api", f"--port={args.api_port}", *config_argv]
    if args.served_model_name:
        command += ["--served-model-name", *args.served_model_name]
    if args.api_key:  # given on our command line, so in `ps` already; the environment is not
        command.append(f"--api-key={args.api_key}")
    if args.chat_template:
        command.append(f"--chat-template={os.path.abspath(args.chat_template)}")
    return command


def worker_argv(args: argparse.Namespace, rank: int, config_argv: list[str]) -> list[str]:
    command = [sys.executable, "-m", "aioworker.cli.main", "--log-level", args.log_level]
    command += ["worker", f"--rank={rank}", *config_argv]
    if args.fake_executor:
        command.append("--fake-executor")
    return command
