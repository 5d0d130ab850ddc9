"""`aioworker top`: a live table of every rank from their heartbeats, a JSON stream of the beats,
a liveness probe (`--check`) or a readiness probe (`--check --ready`). A control-plane tool:
torch-free and quick to start."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import msgspec
import zmq

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.config import ConfigError, WorkerConfig
from aioworker.wire.drops import DropCounter
from aioworker.wire.health import (
    LOADING_STALE_AFTER_INTERVALS,
    STALE_AFTER_INTERVALS,
    BeatTable,
    RankKey,
    expected_ranks,
    rank_label,
)
from aioworker.wire.protocol import HEARTBEAT_DECODER, Heartbeat, ProtocolError
from aioworker.wire.security import ClientSecurity
from aioworker.wire.transport import all_group_endpoints

log = logging.getLogger(__name__)

CLEAR_SCREEN = "\x1b[2J\x1b[H"
# --once waits this many heartbeat intervals (at least ONCE_MIN_WAIT_S) for every rank to beat.
ONCE_WAIT_INTERVALS = 2
ONCE_MIN_WAIT_S = 0.5
CHECK_MIN_WAIT_S = 1.0

EPILOG = f"""\
columns:
  RANK       group.rank (rank 0 of a group is its driver)
  STATE      the rank's state; MISSING = no beat received yet; STALE = no beat for
             {STALE_AFTER_INTERVALS} of its heartbeat intervals ({LOADING_STALE_AFTER_INTERVALS} while it loads, warms
             or takes new weights): killed, frozen or unreachable
  STEP       id of the current (or last) step; STEP_S: seconds the current step has run
  RUN, WAIT  running and waiting requests (driver only)
  KV_BLOCKS  KV cache blocks used/total (driver only)
  CACHED     blocks holding a cached prefix, in use or free (driver only)
  HIT%       prompt tokens found in the prefix cache / prompt tokens looked up (driver only)
  ACC%       speculative decoding: drafts accepted / drafts verified (driver only; - when off)
  ACC_LEN    tokens a sequence gets per verifying step: accepted drafts + 1 (driver only)
  WEIGHTS    the version of the weights (0: as loaded; each update-weights names one)
  QUANT      the linear method of the rank's decoder projections (model.quantization:
             none, cpu-packed, wint8, wint4, ...)
  WEIGHT_MIB MiB of weights the rank holds / MiB it reads per decode step (its own
             shard; quantized and packed copies, and a separate draft's, included)
  EXPERTS    MoE models: the rank's experts (first-last) and its busiest expert's tokens
             over its experts' mean since it started (x1.00 = even; - for a dense model)
  HOST_KV    the host KV tier (shown when a group has one; driver only): blocks used/total,
             and "37hit": prefix blocks loaded back from the host since the group started
  AGE_S      seconds since this rank's last beat arrived here

--check (liveness) exits 0 when every rank of the deployment beats and none is FAILED,
STOPPED, STALE or MISSING; otherwise it names the unhealthy ranks on stderr and exits 1.
A rank that is starting (LOADING, ...), PAUSED or DRAINING passes: it is alive, so a
supervisor should not restart it, though it may not take requests.

--check --ready (readiness) exits 0 only when every rank is READY; otherwise it names each
rank that is not, with its state, on stderr and exits 1. Route traffic on this one."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--once", action="store_true", help="print one table (after ~2 heartbeats) and exit"
    )
    mode.add_argument(
        "--json",
        action="store_true",
        help="stream every beat received as one JSON object per line, with received_at",
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="liveness probe: exit 0 if every rank is alive, else name the bad ones and exit 1",
    )
    parser.add_argument(
        "--ready",
        action="store_true",
        help="with --check: readiness probe: exit 0 only if every rank is READY",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="redraw period (default: 1.0)"
    )
    parser.add_argument(
        "--wait",
        type=float,
        metavar="S",
        help="--check: how long to wait for beats, or for READY with --ready "
        "(default: 3 heartbeat intervals, at least 1s)",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        endpoints = heartbeat_endpoints(config)
        security = ClientSecurity.from_config(config)
    except (ConfigError, OSError) as exc:
        return fail(str(exc))
    if args.interval <= 0 or (args.wait is not None and args.wait <= 0):
        return fail("--interval and --wait take a positive number of seconds")
    if args.ready and not args.check:
        return fail("--ready goes with --check: run `aioworker top --check --ready`")
    parallel = config.parallel
    table = BeatTable(expected_ranks(parallel.tensor_parallel_size, parallel.data_parallel_size))
    with BeatReceiver(list(endpoints.values()), security) as receiver:
        try:
            return run_mode(args, config, receiver, table, endpoints)
        except KeyboardInterrupt:
            return 0
        except BrokenPipeError:
            # The reader went away (`aioworker top --json | head`): stop quietly.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


def run_mode(
    args: argparse.Namespace,
    config: WorkerConfig,
    receiver: BeatReceiver,
    table: BeatTable,
    endpoints: dict[RankKey, str],
) -> int:
    interval = config.runtime.heartbeat_interval_s
    if args.check:
        wait_s = args.wait or max(CHECK_MIN_WAIT_S, STALE_AFTER_INTERVALS * interval)
        probe = READINESS if args.ready else LIVENESS
        return check(receiver, table, endpoints, wait_s, probe)
    if args.json:
        return stream_json(receiver)
    if args.once:
        print_once(receiver, table, max(ONCE_MIN_WAIT_S, ONCE_WAIT_INTERVALS * interval))
        return 0
    return live(receiver, table, args.interval, config.runtime.name)


def heartbeat_endpoints(config: WorkerConfig) -> dict[RankKey, str]:
    parallel = config.parallel
    groups = all_group_endpoints(
        config.runtime, parallel.tensor_parallel_size, parallel.data_parallel_size
    )
    return {(g.group, rank): ep for g in groups for rank, ep in enumerate(g.heartbeats)}


class BeatReceiver:
    """One SUB socket connected to every rank's heartbeat endpoint."""

    def __init__(self, endpoints: list[str], security: ClientSecurity | None = None) -> None:
        """With CURVE (tcp and [security]) it presents the client's key: every rank of a
        deployment shares one server key, so one set of options serves every endpoint."""
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        options = (security or ClientSecurity()).connect_options(endpoints[0]) if endpoints else {}
        for option, value in options.items():
            self.sock.setsockopt(option, value)
        for endpoint in endpoints:
            self.sock.connect(endpoint)
        self.malformed = DropCounter(log, "malformed heartbeats")

    def receive(self, timeout_s: float) -> Heartbeat | None:
        """The next beat, or None after `timeout_s` (or on a frame that is not a heartbeat)."""
        if not self.sock.poll(max(0, int(timeout_s * 1000))):
            return None
        frames = self.sock.recv_multipart()
        try:
            return HEARTBEAT_DECODER.decode(frames)
        except ProtocolError as exc:
            self.malformed.count(str(exc))
            return None

    def __enter__(self) -> BeatReceiver:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close(linger=0)
        self.context.term()


def collect(
    receiver: BeatReceiver,
    table: BeatTable,
    until: float,
    is_done: Callable[[], bool] = lambda: False,
) -> None:
    """Record beats until the monotonic time `until`, or until `is_done()` after a beat."""
    while (now := time.monotonic()) < until:
        beat = receiver.receive(until - now)
        if beat is None:
            continue
        table.record(beat, time.monotonic())
        if is_done():
            return


@dataclass(frozen=True)
class Probe:
    """What --check asks of every rank, and how its answer reads."""

    failing: Callable[[BeatTable, float], dict[RankKey, str]]
    # "rank 0.1 is <failed_word>: <reason>"
    failed_word: str
    passed_line: str


LIVENESS = Probe(BeatTable.unhealthy, "unhealthy", "healthy: all {} rank(s) beating")
READINESS = Probe(BeatTable.not_ready, "not ready", "ready: all {} rank(s) READY")


def check(
    receiver: BeatReceiver,
    table: BeatTable,
    endpoints: dict[RankKey, str],
    wait_s: float,
    probe: Probe,
) -> int:
    def is_passing() -> bool:
        return not probe.failing(table, time.monotonic())

    collect(receiver, table, time.monotonic() + wait_s, is_passing)
    failing = probe.failing(table, time.monotonic())
    if not failing:
        print(probe.passed_line.format(len(table.keys())))
        return 0
    for key, reason in failing.items():
        where = f" (heartbeats from {endpoints[key]})" if key in endpoints else ""
        print(f"rank {rank_label(key)} is {probe.failed_word}: {reason}{where}", file=sys.stderr)
    print(
        f"aioworker: {len(failing)} of {len(table.keys())} rank(s) {probe.failed_word} "
        f"after waiting up to {wait_s:g}s",
        file=sys.stderr,
    )
    return 1


def print_once(receiver: BeatReceiver, table: BeatTable, wait_s: float) -> None:
    collect(receiver, table, time.monotonic() + wait_s, table.has_all_beaten)
    print(table.render(time.monotonic()))


def live(receiver: BeatReceiver, table: BeatTable, refresh_s: float, name: str) -> NoReturn:
    is_tty = sys.stdout.isatty()
    next_draw = time.monotonic() + refresh_s
    while True:
        collect(receiver, table, next_draw)
        text = f"aioworker top: {name}  {time.strftime('%H:%M:%S')}\n"
        text += table.render(time.monotonic()) + "\n"
        sys.stdout.write(CLEAR_SCREEN + text if is_tty else text + "\n")
        sys.stdout.flush()
        next_draw = max(next_draw + refresh_s, time.monotonic())


def stream_json(receiver: BeatReceiver) -> NoReturn:
    while True:
        beat = receiver.receive(timeout_s=1.0)
        if beat is not None:
            sys.stdout.write(beat_json(beat, time.time()) + "\n")
            sys.stdout.flush()


def beat_json(beat: Heartbeat, received_at: float) -> str:
    """The beat's fields (with its "type" tag) plus the local wall-clock time it arrived."""
    record = msgspec.to_builtins(beat)
    record["received_at"] = received_at
    return msgspec.json.encode(record).decode()
