"""`aioworker admin COMMAND [ARG]`: send one admin command to the driver of each worker group and
print the replies, or wait until every group is READY (`wait-ready`, built on `status`). A
control-plane tool: torch-free and quick to start."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.config import ConfigError, WorkerConfig
from aioworker.wire.admin_client import GroupReply, default_timeout, send
from aioworker.wire.admin_commands import ADMIN_COMMANDS, LOG_LEVELS, AdminCommandInfo
from aioworker.wire.health import describe_weights, is_ready_state
from aioworker.wire.protocol import AdminRequest

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

WAIT_READY = "wait-ready"
# Long enough for a large model to load and its CUDA graphs to be captured.
WAIT_READY_TIMEOUT_S = 300.0
WAIT_READY_POLL_S = 0.5
# How long one `status` may take to answer before the group counts as unreachable this round.
STATUS_REPLY_S = 2.0
UNREACHABLE = "unreachable"
# wait-ready is a verb of this tool, not of the driver: it polls `status`.
CLIENT_COMMANDS = {
    WAIT_READY: AdminCommandInfo(
        "none",
        "wait-ready",
        "poll status of every group until each one is READY (admits requests); exit 0 then, or "
        f"3 after --timeout (default {WAIT_READY_TIMEOUT_S:g}s) naming each group that is not "
        "and its last state. For start-up scripts: `aioworker serve & aioworker admin wait-ready`",
    )
}
COMMANDS = {**ADMIN_COMMANDS, **CLIENT_COMMANDS}

EPILOG = "commands:\n" + "\n".join(
    textwrap.fill(info.help, 92, initial_indent=f"  {info.usage:22}", subsequent_indent=" " * 24)
    for info in COMMANDS.values()
)
EPILOG += """

exit status: 0 every group replied ok (wait-ready: is READY); 1 a group refused the command;
2 bad arguments; 3 a group did not reply within --timeout (not running, or a different
runtime.name), or wait-ready's --timeout passed before every group was READY"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "admin_command",
        choices=list(COMMANDS),
        metavar="COMMAND",
        help="one of the commands below",
    )
    parser.add_argument(
        "argument", nargs="?", default="", metavar="ARG", help="the command's argument, if any"
    )
    parser.add_argument(
        "--group", type=int, metavar="G", help="data-parallel group (default: every group)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for each group's reply (default: 5; 600 for weights and memory); "
        f"wait-ready: for every group to be READY (default: {WAIT_READY_TIMEOUT_S:g})",
    )
    weights = parser.add_argument_group("update-weights and release-memory")
    weights.add_argument(
        "--version",
        type=int,
        help="update-weights: the new weights' version (default: current + 1)",
    )
    weights.add_argument(
        "--mode",
        choices=["wait", "keep", "abort"],
        default="wait",
        help="update-weights: running requests finish first (wait, the default), continue on the new weights (keep), or end (abort)",
    )
    weights.add_argument("--weights", action="store_true", help="release-memory: the weights")
    weights.add_argument("--kv-cache", action="store_true", help="release-memory: the KV cache")
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per group: group, ok, message, data"
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    error = argument_error(args.admin_command, args.argument)
    if error is None and args.timeout is not None and not args.timeout > 0:
        error = f"--timeout {args.timeout:g}: give a positive number of seconds"
    if error is not None:
        return fail(error, EXIT_USAGE)
    try:
        config = config_from_args(args)
        groups = selected_groups(config, args.group)
        if args.admin_command == WAIT_READY:
            timeout = WAIT_READY_TIMEOUT_S if args.timeout is None else args.timeout
            return wait_ready(config, groups, timeout, args.json)
        request = build_request(args)
        timeout = args.timeout if args.timeout is not None else default_timeout(args.admin_command)
        replies = [send(config, group, request, timeout) for group in groups]
    except (ConfigError, ValueError, OSError) as exc:
        return fail(str(exc), EXIT_USAGE)
    for reply in replies:
        show(reply, args.admin_command, args.json)
    return exit_code(replies)


def build_request(args: argparse.Namespace) -> AdminRequest:
    release_both = not (args.weights or args.kv_cache)
    return AdminRequest(
        command=args.admin_command,
        argument=str(Path(args.argument).resolve())
        if args.admin_command == "update-weights"
        else args.argument,
        version=args.version,
        mode=args.mode,
        weights=args.weights or release_both,
        kv_cache=args.kv_cache or release_both,
    )


def argument_error(command: str, argument: str) -> str | None:
    """Why `command argument` is malformed, checked before anything is sent."""
    info = COMMANDS[command]
    if info.argument == "none" and argument:
        return f"{command} takes no argument (got {argument!r}); usage: {info.usage}"
    if info.argument == "required" and not argument:
        return f"{command} needs an argument; usage: {info.usage}"
    if command == "set-log-level" and argument.upper() not in LOG_LEVELS:
        return f"log level {argument!r} is not one of {', '.join(LOG_LEVELS)}"
    if command == "drain" and argument:
        return drain_deadline_error(argument)
    return None


def drain_deadline_error(argument: str) -> str | None:
    try:
        deadline = float(argument)
    except ValueError:
        return f"drain deadline {argument!r} is not a number of seconds"
    if not deadline >= 0:
        return f"drain deadline {argument!r} must be 0 or more seconds"
    return None


def selected_groups(config: WorkerConfig, group: int | None) -> list[int]:
    num_groups = config.parallel.data_parallel_size
    if group is None:
        return list(range(num_groups))
    if not 0 <= group < num_groups:
        raise ValueError(
            f"--group {group} is outside this deployment's groups 0..{num_groups - 1} "
            "(parallel.data_parallel_size)"
        )
    return [group]


def show(result: GroupReply, command: str, as_json: bool) -> None:
    reply = result.reply
    if as_json:
        record = {"group": result.group, "ok": reply.ok, "message": reply.message}
        print(json.dumps({**record, "data": reply.data}))
        if not result.is_reachable:
            report_error(result)
    elif not reply.ok:
        report_error(result)
    elif command == "status":
        print(format_status(result.group, reply.data))
    else:
        print(f"group {result.group}: {reply.message}")


def report_error(result: GroupReply) -> None:
    print(f"aioworker: error: group {result.group}: {result.reply.message}", file=sys.stderr)


def format_status(group: int, data: dict[str, Any]) -> str:
    """`group G` then one aligned `key  value` line per field of the status reply (a line per
    rank for `weights_per_rank` and `expert_load_per_rank`)."""
    width = max((len(key) for key in data), default=0)
    lines = [f"group {group}"]
    per_rank = {"weights_per_rank": format_weights, "expert_load_per_rank": format_expert_load}
    for key, value in data.items():
        texts = per_rank[key](value) if key in per_rank else [format_value(value)]
        lines += [f"  {key.ljust(width)}  {texts[0]}"]
        lines += [f"  {' ' * width}  {text}" for text in texts[1:]]
    return "\n".join(lines)


def format_weights(ranks: list[dict[str, Any]]) -> list[str]:
    """'rank 0: wint4, 118 MiB held, 96 MiB read/step', one per rank that has loaded."""
    lines = []
    for rank in ranks:
        held, read = rank["weight_bytes_held"], rank["weight_bytes_read"]
        lines.append(f"rank {rank['rank']}: {describe_weights(rank['quantization'], held, read)}")
    return lines or ["-"]


def format_expert_load(ranks: list[dict[str, Any]]) -> list[str]:
    """'rank 1: experts 4-7 of 8 (expert parallel); tokens per expert per step 1 / 1.5 / 3
    (min / mean / max), imbalance x2.00, 12 steps', one per rank."""
    lines = []
    for rank in ranks:
        load = rank["tokens_per_expert_per_step"]
        lines.append(
            f"rank {rank['rank']}: {rank['experts']}; tokens per expert per step "
            f"{load['min']:g} / {load['mean']:g} / {load['max']:g} (min / mean / max), "
            f"imbalance x{rank['imbalance']:.2f}, {rank['steps']} steps"
        )
    return lines or ["-"]


def format_value(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def exit_code(replies: list[GroupReply]) -> int:
    if not all(result.is_reachable for result in replies):
        return EXIT_UNREACHABLE
    if not all(result.reply.ok for result in replies):
        return EXIT_REFUSED
    return EXIT_OK


# -- wait-ready -----------------------------------------------------------------------------------


def wait_ready(config: WorkerConfig, groups: list[int], timeout_s: float, as_json: bool) -> int:
    """Poll `status` of the groups until all are READY (exit 0) or timeout_s passes (exit 3)."""
    deadline = time.monotonic() + timeout_s
    while True:
        # Every group each round: all of them must be READY at once, not each at some point.
        replies = [poll_status(config, group, deadline) for group in groups]
        is_ready = all(is_ready_state(group_state(result)) for result in replies)
        if is_ready or time.monotonic() >= deadline:
            break
        time.sleep(max(0.0, min(WAIT_READY_POLL_S, deadline - time.monotonic())))
    for result in replies:
        show_readiness(result, timeout_s, as_json)
    return EXIT_OK if is_ready else EXIT_UNREACHABLE


def poll_status(config: WorkerConfig, group: int, deadline: float) -> GroupReply:
    # A short wait even past the deadline: the last round still gets its answers.
    timeout_s = min(STATUS_REPLY_S, max(0.1, deadline - time.monotonic()))
    return send(config, group, AdminRequest(command="status"), timeout_s)


def group_state(result: GroupReply) -> str:
    if not result.is_reachable:
        return UNREACHABLE
    return str(result.reply.data.get("state") or result.reply.message)


def show_readiness(result: GroupReply, timeout_s: float, as_json: bool) -> None:
    state = group_state(result)
    ready = is_ready_state(state)
    if as_json:
        record = {"group": result.group, "ok": ready, "message": state}
        print(json.dumps({**record, "data": result.reply.data}))
    elif ready:
        print(f"group {result.group}: {state}")
    if not ready:
        why = f"{state}: {result.reply.message}" if state == UNREACHABLE else state
        print(
            f"aioworker: error: group {result.group} is not READY after {timeout_s:g}s: {why}",
            file=sys.stderr,
        )
