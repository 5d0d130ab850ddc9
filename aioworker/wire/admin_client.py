"""Send one admin command to a group's driver and read its reply: what `aioworker admin`, the
benchmarks and the tests use. Blocking and torch-free."""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from aioworker.config import WorkerConfig
from aioworker.wire.admin_commands import ADMIN_COMMANDS
from aioworker.wire.protocol import (
    ADMIN_REPLY_DECODER,
    AdminReply,
    AdminRequest,
    ProtocolError,
    encode,
)
from aioworker.wire.security import ClientSecurity
from aioworker.wire.transport import group_endpoints

# Weights and memory commands can take minutes: their default wait is longer.
DEFAULT_TIMEOUT_S = 5.0
LONG_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class GroupReply:
    group: int
    reply: AdminReply
    # False when no reply came within the timeout (reply then says so).
    is_reachable: bool = True


def default_timeout(command: str) -> float:
    return LONG_TIMEOUT_S if ADMIN_COMMANDS[command].is_long else DEFAULT_TIMEOUT_S


def send(
    config: WorkerConfig,
    group: int,
    request: AdminRequest,
    timeout_s: float,
    raw_frames: list[bytes] | None = None,
) -> GroupReply:
    """One request to one group's driver over a DEALER socket (a CURVE client when [security]
    has keys), waiting up to timeout_s."""
    endpoint = group_endpoints(config.runtime, group, config.parallel.tensor_parallel_size).admin
    security = ClientSecurity.from_config(config)
    context = zmq.Context()
    try:
        with context.socket(zmq.DEALER) as sock:
            sock.setsockopt(zmq.LINGER, 0)
            for option, value in security.connect_options(endpoint).items():
                sock.setsockopt(option, value)
            sock.connect(endpoint)
            # Pushed tensors travel as raw frames after the message (update-weights).
            sock.send_multipart([*encode(request), *(raw_frames or [])])
            if sock.poll(int(timeout_s * 1000)):
                return GroupReply(group, decode_reply(sock.recv_multipart(), endpoint))
    finally:
        context.term()
    message = (
        f"no reply from {endpoint} within {timeout_s:g}s; is the group's driver running "
        f"under runtime.name={config.runtime.name!r}?"
    )
    if security.is_enabled:
        message += (
            " With CURVE on, check that security.server_public_key_file is the driver's and "
            "that this tool's .key file is in the driver's admin_clients_dir (admin commands "
            "need an admin key)."
        )
    return GroupReply(group, AdminReply(ok=False, message=message), is_reachable=False)


def decode_reply(frames: list[bytes], endpoint: str) -> AdminReply:
    try:
        return ADMIN_REPLY_DECODER.decode(frames)
    except ProtocolError as exc:
        return AdminReply(ok=False, message=f"unreadable reply from {endpoint}: {exc}")
