"""Run the gateway under uvicorn, on uvloop and httptools, in this process.

The listening socket is bound here, before uvicorn starts, so port 0 works: the line printed at
start names the port the server got. SIGTERM lets open requests finish for
`api.shutdown_timeout_s`; closing the client then aborts whatever is left in the workers."""

from __future__ import annotations

import logging
import socket
import sys
from types import FrameType

import uvicorn

from aioworker.api.app import build_app
from aioworker.api.gateway import Gateway


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
    config = uvicorn.Config(
        build_app(gateway),
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=log_level.lower(),
        access_log=gateway.options.access_log,
        timeout_graceful_shutdown=gateway.options.shutdown_timeout_s,
    )
    if gateway.options.access_log:  # shown whatever --log-level says
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    _Server(config).run(sockets=[sock])


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
