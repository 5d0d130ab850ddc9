"""Endpoint naming (all derived from one config) and ZeroMQ socket construction.

Single host: `ipc://` sockets in a 0700 runtime directory. Several hosts: `tcp://host:port`
with ports laid out from `base_port`. A bind on an ipc path that a live process already serves
is refused instead of silently taking the socket over.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from aioworker.config import ConfigError, RuntimeOptions

# tcp port offsets inside a group's block of ports.
_TASKS, _ADMIN, _CONTROL, _ACKS, _DIST, _HEARTBEAT0 = range(6)


class EndpointInUseError(RuntimeError):
    """Another live process already serves this endpoint."""


class UnsafeRuntimeDirectory(ConfigError):
    """The ipc runtime directory is not this user's alone (a configuration error: exit 2)."""


@dataclass(frozen=True)
class GroupEndpoints:
    group: int
    tasks: str
    admin: str
    control: str
    acks: str
    # torch.distributed rendezvous for the group's tensor-parallel collectives (always tcp).
    dist_init: str
    heartbeats: tuple[str, ...]


def runtime_directory(runtime: RuntimeOptions) -> Path:
    """The ipc directory, created owner-only; an existing one must be ours and not group/world open."""
    if runtime.runtime_dir:
        path = Path(runtime.runtime_dir)
    elif xdg := os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(xdg) / "aioworker"
    else:
        path = Path(f"/tmp/aioworker-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UnsafeRuntimeDirectory(
            f"runtime directory {path} must be owned by uid {os.getuid()} with mode 0700 "
            f"(it is uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}); fix it or set runtime.runtime_dir"
        )
    return path


def rank_host(runtime: RuntimeOptions, global_rank: int) -> str:
    hosts = runtime.rank_hosts
    return hosts[global_rank] if global_rank < len(hosts) and hosts[global_rank] else runtime.host


def group_endpoints(runtime: RuntimeOptions, group: int, tp_size: int) -> GroupEndpoints:
    stride = _HEARTBEAT0 + tp_size
    base = runtime.base_port + group * stride
    driver_host = rank_host(runtime, group * tp_size)
    dist_init = f"tcp://{driver_host}:{base + _DIST}"
    if runtime.transport == "tcp":

        def addr(offset: int) -> str:
            # Each rank's heartbeat binds on its own host; the group's sockets on its driver's.
            rank = offset - _HEARTBEAT0
            host = rank_host(runtime, group * tp_size + rank) if rank >= 0 else driver_host
            return f"tcp://{host}:{base + offset}"
    else:
        directory = runtime_directory(runtime)

        def addr(offset: int) -> str:
            names = {_TASKS: "tasks", _ADMIN: "admin", _CONTROL: "control", _ACKS: "acks"}
            name = names.get(offset) or f"heartbeat-r{offset - _HEARTBEAT0}"
            return f"ipc://{directory}/{runtime.name}-g{group}-{name}"

    return GroupEndpoints(
        group=group,
        tasks=addr(_TASKS),
        admin=addr(_ADMIN),
        control=addr(_CONTROL),
        acks=addr(_ACKS),
        dist_init=dist_init,
        heartbeats=tuple(addr(_HEARTBEAT0 + r) for r in range(tp_size)),
    )


def driver_heartbeat_endpoint(task_endpoint: str) -> str:
    """Where the driver that binds `task_endpoint` beats (the layout of group_endpoints)."""
    if task_endpoint.startswith("ipc://"):
        return task_endpoint.removesuffix("-tasks") + "-heartbeat-r0"
    host, _, port = task_endpoint.rpartition(":")
    return f"{host}:{int(port) - _TASKS + _HEARTBEAT0}"


def remove_ipc_file(endpoint: str) -> None:
    """Remove the socket file of an ipc endpoint this process bound and closed."""
    if endpoint.startswith("ipc://"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(endpoint.removeprefix("ipc://"))


def listen_for_rendezvous(dist_init: str) -> int:
    """A socket listening on the group's torch.distributed rendezvous (tcp://host:port) on that
    host alone; its file descriptor, for rank 0's store to own."""
    parts = urlsplit(dist_init)
    family, kind, proto, _, address = socket.getaddrinfo(
        parts.hostname, parts.port, type=socket.SOCK_STREAM
    )[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise EndpointInUseError(f"the rendezvous {dist_init} cannot be bound: {exc}") from exc
    return listener.detach()


def all_group_endpoints(
    runtime: RuntimeOptions, tp_size: int, dp_size: int
) -> list[GroupEndpoints]:
    return [group_endpoints(runtime, g, tp_size) for g in range(dp_size)]


def client_reply_endpoint(runtime: RuntimeOptions) -> str:
    """Where a client binds its result socket (tcp: this machine's address towards the first
    driver, on a free port chosen at bind)."""
    if runtime.transport == "tcp":
        return f"tcp://{local_address_towards(rank_host(runtime, 0))}:*"
    return f"ipc://{runtime_directory(runtime)}/{runtime.name}-client-{uuid.uuid4().hex[:12]}"


def local_address_towards(host: str) -> str:
    """The address of this machine that `host` can reach us at (no packet is sent)."""
    if host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))
        return probe.getsockname()[0]
    finally:
        probe.close()


def ensure_not_served(endpoint: str) -> None:
    """Refuse to bind an ipc path another live process is serving (zmq would take it over)."""
    if not endpoint.startswith("ipc://"):
        return  # tcp binds fail on their own with EADDRINUSE
    path = endpoint.removeprefix("ipc://")
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return  # a stale file from a dead process: binding replaces it
        raise
    finally:
        probe.close()
    raise EndpointInUseError(
        f"{endpoint} is already served by another process; stop it, or give this deployment "
        "another runtime.name"
    )


def make_socket(
    context: zmq.asyncio.Context,
    kind: int,
    *,
    bind: str | None = None,
    connect: str | list[str] | None = None,
    hwm: int | None = None,
    options: Mapping[int, int | bytes] | None = None,
    max_message_bytes: int | None = None,
) -> zmq.asyncio.Socket:
    """A socket that binds and/or connects; `options` (e.g. CURVE keys from security.py) are set
    before either, as ZeroMQ requires. With `max_message_bytes`, a peer that sends a longer
    message is disconnected before it is read."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if max_message_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
    try:
        for option, value in (options or {}).items():
            sock.setsockopt(option, value)
        if bind is not None:
            ensure_not_served(bind)
            try:
                sock.bind(bind)
            except zmq.ZMQError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise EndpointInUseError(
                        f"{bind} is already in use by another process"
                    ) from exc
                raise
        for endpoint in [connect] if isinstance(connect, str) else connect or []:
            sock.connect(endpoint)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def bound_endpoint(sock: zmq.Socket) -> str:
    """The concrete endpoint of the last bind (resolves tcp://host:* to the port chosen)."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
