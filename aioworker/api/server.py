"""Run the gateway under uvicorn, on uvloop and httptools (with the limits of http_limits.py),
in this process.

The listening socket is bound here, before uvicorn starts, so port 0 works: the line printed at
start names the port the server got. SIGTERM lets open requests finish for
`api.shutdown_timeout_s`; closing the client then aborts whatever is left in the workers."""

from __future__ import annotations

import functools
import logging
import socket
import sys
from types import FrameType

import uvicorn

from aioworker.api.app import build_app
from aioworker.api.gateway import Gateway
from aioworker.api.http_limits import HttpLimits, LimitedHttpToolsProtocol


def serve(gateway: Gateway, host: str, port: int, log_level: str = "warning") -> None:
    sock = listening_socket(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    groups = len(gateway.client.task_endpoints)
    print(
        f"aioworker api: serving {gateway.model_name!r} on http://{bound_host}:{bound_port} "
        f"to {groups} worker group(s)",
        file=sys.stderr,
        flush=True,
    )
    _Server(server_config(gateway, log_level)).run(sockets=[sock])


def server_config(gateway: Gateway, log_level: str = "warning") -> uvicorn.Config:
    options = gateway.options
    protocol = functools.partial(LimitedHttpToolsProtocol, limits=HttpLimits.from_options(options))
    config = uvicorn.Config(
        build_app(gateway),
        loop="uvloop",
        http=protocol,  # type: ignore[arg-type]  # a factory of the protocol, as uvicorn calls it
        lifespan="on",
        log_level=log_level.lower(),
        access_log=options.access_log,
        timeout_keep_alive=options.keep_alive_timeout_s,  # type: ignore[arg-type]  # a float works
        timeout_graceful_shutdown=options.shutdown_timeout_s,  # type: ignore[arg-type]
    )
    if options.access_log:  # shown whatever --log-level says
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    return config


class _Server(uvicorn.Server):
    """Exits 0 after a graceful stop on SIGTERM or SIGINT: uvicorn would raise the signal again
    once stopped, and a supervisor would see a process killed by it."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
