"""`--connect`: which groups a client-side command (generate, api) talks to, and where its result
socket binds. No value means the endpoints the configuration gives."""

from __future__ import annotations

import argparse
from urllib.parse import urlparse

import msgspec

from aioworker.config import WorkerConfig
from aioworker.wire.client import Client
from aioworker.wire.security import ClientSecurity
from aioworker.wire.transport import client_reply_endpoint, local_address_towards


class _AppendEndpoint(argparse.Action):
    def __call__(self, parser, namespace, value, option_string=None) -> None:
        endpoints = getattr(namespace, self.dest) or []
        setattr(namespace, self.dest, [*endpoints, value])


def add_connect_argument(parser: argparse._ActionsContainer, what: str) -> None:
    parser.add_argument(
        "--connect",
        nargs="?",
        const="config",
        metavar="ENDPOINT",
        help=f"{what}: a group's task endpoint (repeat for several groups), or no value to use "
        "the endpoints of --config",
        action=_AppendEndpoint,
    )


def client_for(connect: list[str] | None, config: WorkerConfig) -> Client:
    """A client of the groups `connect` names (None: the configuration's); ValueError names a
    bad endpoint."""
    if connect is None or connect == ["config"]:
        return Client.from_config(config)
    tasks, reply = endpoints(connect, config)
    return Client(tasks, reply, security=ClientSecurity.from_config(config))


def endpoints(connect: list[str], config: WorkerConfig) -> tuple[list[str], str]:
    """Task endpoints named on the command line, and where to bind this client's result socket."""
    if "config" in connect:
        raise ValueError(
            "give --connect either endpoints or no value (the config's endpoints), not both"
        )
    first = urlparse(connect[0])
    if first.scheme == "ipc":
        runtime = msgspec.structs.replace(config.runtime, transport="ipc")
        return connect, client_reply_endpoint(runtime)
    if first.scheme == "tcp" and first.hostname:
        return connect, f"tcp://{local_address_towards(first.hostname)}:*"
    raise ValueError(f"--connect {connect[0]!r} is not an ipc:// or tcp://host:port endpoint")
