"""Where a driver agrees to send a request's outputs. `reply_to` comes from the client, so a
client could make the worker connect anywhere: the endpoint must use the deployment's transport,
an ipc path must lie in the runtime directory, and a tcp host must be the address the request
came from (or one of security.reply_hosts)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from aioworker.config import WorkerConfig
from aioworker.wire.transport import runtime_directory


class ReplyNotAllowed(ValueError):
    """The message says which reply_to was refused and why."""


class ReplyPolicy:
    def __init__(self, config: WorkerConfig) -> None:
        self.transport = config.runtime.transport
        self.directory = runtime_directory(config.runtime) if self.transport == "ipc" else None
        self.hosts = frozenset(config.security.reply_hosts)

    def check(self, reply_to: str, peer_address: str | None) -> None:
        """Raises ReplyNotAllowed; `peer_address`: where the request came from (tcp)."""
        scheme = f"{self.transport}://"
        if not reply_to.startswith(scheme):
            raise ReplyNotAllowed(f"reply_to {reply_to!r} must be a {scheme} endpoint")
        if self.directory is not None:
            path = Path(reply_to.removeprefix(scheme))
            if path.parent.resolve() != self.directory.resolve():
                raise ReplyNotAllowed(
                    f"reply_to {reply_to!r} is outside the runtime directory {self.directory}"
                )
            return
        host = urlsplit(reply_to).hostname or ""
        allowed = self.hosts or {peer_address}
        if host not in allowed:
            raise ReplyNotAllowed(
                f"reply_to {reply_to!r}: host {host!r} is not the address the request came from "
                f"({peer_address}) nor in security.reply_hosts"
            )
