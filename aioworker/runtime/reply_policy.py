"""Where a driver agrees to send a request's outputs. `reply_to` comes from the client, so a
client could make the worker connect anywhere: the endpoint must use the deployment's transport,
an ipc path must lie in the runtime directory, and a tcp host must be the address the request
came from (or one of security.reply_hosts)."""

from __future__ import annotations

import functools
import os
from urllib.parse import urlsplit

from aioworker.config import WorkerConfig
from aioworker.wire.transport import runtime_directory


class ReplyNotAllowed(ValueError):
    """The message says which reply_to was refused and why."""


class ReplyPolicy:
    def __init__(self, config: WorkerConfig) -> None:
        self.transport = config.runtime.transport
        self.directory = runtime_directory(config.runtime) if self.transport == "ipc" else None
        # The directory as configured and as resolved: a reply_to's folder must be one of them,
        # exactly (the directory is this user's alone, so nothing in it can point elsewhere).
        self.folders = (
            {str(self.directory), str(self.directory.resolve())} if self.directory else set()
        )
        self.hosts = frozenset(config.security.reply_hosts)
        # A client sends every request with the same reply_to: its verdict is remembered.
        self.check = functools.lru_cache(maxsize=4096)(self._check)

    def _check(self, reply_to: str, peer_address: str | None) -> None:
        """Raises ReplyNotAllowed; `peer_address`: where the request came from (tcp)."""
        scheme = f"{self.transport}://"
        if not reply_to.startswith(scheme):
            raise ReplyNotAllowed(f"reply_to {reply_to!r} must be a {scheme} endpoint")
        if self.directory is not None:
            if os.path.dirname(reply_to.removeprefix(scheme)) not in self.folders:
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
