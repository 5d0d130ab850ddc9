"""The admin commands a group's driver answers: the one table that the protocol, the driver's
handlers and `aioworker admin` all read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from aioworker.config import RuntimeOptions

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class AdminCommandInfo:
    # Whether the command takes an argument: no, optionally, or always.
    argument: Literal["none", "optional", "required"]
    usage: str
    help: str
    # Holds the group's steps and may take minutes: answered when done, with a long timeout.
    is_long: bool = False


ADMIN_COMMANDS: dict[str, AdminCommandInfo] = {
    "status": AdminCommandInfo(
        "none", "status", "state, queue depths, KV blocks, counters and model of the group"
    ),
    "pause": AdminCommandInfo(
        "none", "pause", "stop stepping: running requests hold, new ones queue"
    ),
    "resume": AdminCommandInfo("none", "resume", "step again after pause"),
    "drain": AdminCommandInfo(
        "optional",
        "drain [DEADLINE_S]",
        "refuse new requests, finish those in flight, then stop; abort what still runs after "
        f"DEADLINE_S seconds (default {RuntimeOptions().drain_timeout_s:g}, "
        "runtime.drain_timeout_s)",
    ),
    "abort": AdminCommandInfo(
        "required", "abort REQUEST_ID", "abort one request; its client gets 'abort'"
    ),
    "shutdown": AdminCommandInfo("none", "shutdown", "abort every request and stop the group now"),
    "reset-prefix-cache": AdminCommandInfo(
        "none",
        "reset-prefix-cache",
        "forget every cached KV block: later requests compute their prompts in full (before a "
        "benchmark, or to free the blocks at once)",
    ),
    "set-log-level": AdminCommandInfo(
        "required", "set-log-level LEVEL", f"one of {', '.join(LOG_LEVELS)}"
    ),
    "update-weights": AdminCommandInfo(
        "required",
        "update-weights DIR",
        "load new weights from a safetensors directory on every rank, checked before anything "
        "is replaced (all ranks or none); --version V names them, --mode wait|keep|abort says "
        "what running requests do: finish first, continue on the new weights, or end",
        is_long=True,
    ),
    "release-memory": AdminCommandInfo(
        "none",
        "release-memory",
        "free device memory: --weights and/or --kv-cache (default both); steps hold until "
        "resume-memory",
        is_long=True,
    ),
    "resume-memory": AdminCommandInfo(
        "none", "resume-memory", "restore the weights and KV cache and serve again", is_long=True
    ),
}

LONG_COMMANDS = frozenset(name for name, info in ADMIN_COMMANDS.items() if info.is_long)
