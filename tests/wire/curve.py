"""Key sets and tcp configs shared by the CURVE tests."""

from __future__ import annotations

import random
import socket

from aioworker.cli import keys as keys_cli
from aioworker.config import WorkerConfig, load_config

ANY_PORT = "tcp://127.0.0.1:*"
# Long enough for a CURVE handshake on a loaded machine; a refused peer never answers anyway.
REFUSED_WAIT_MS = 500
ANSWER_WAIT_MS = 5000


def security_settings(
    files: keys_cli.KeyFiles, client: keys_cli.KeyFiles | None = None, as_admin: bool = False
) -> dict:
    """[security] of `files`, with the client keys of `client` if given (its admin pair with
    `as_admin`)."""
    client = client or files
    public, secret = (
        (client.admin_public, client.admin_secret)
        if as_admin
        else (client.client_public, client.client_secret)
    )
    return {
        "security.server_secret_key_file": str(files.server_secret),
        "security.server_public_key_file": str(files.server_public),
        "security.authorized_clients_dir": str(files.authorized_clients_dir),
        "security.admin_clients_dir": str(files.admin_clients_dir),
        "security.client_secret_key_file": str(secret),
        "security.client_public_key_file": str(public),
    }


def tcp_config(files: keys_cli.KeyFiles, **overrides) -> WorkerConfig:
    settings = {"runtime.transport": "tcp", **security_settings(files), **overrides}
    return load_config(overrides=settings)


def free_port_block(size: int) -> int:
    """A base port whose next `size` ports are free on 127.0.0.1 now."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 60000 - size)
        probes = [socket.socket() for _ in range(size)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"no block of {size} free ports found")
