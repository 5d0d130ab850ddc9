"""Outputs go to each request's `reply_to` endpoint, over one PUSH socket per client, reused.

Sends never block the loop, and no output is dropped while its client lives: what a client's
socket cannot take now waits in that client's outbox, in order, and is sent as soon as it can
be. A client whose outbox has not moved for a second is probed: if nothing listens at its
reply_to any more (its process died), it is given up at once; a client that lives but reads
nothing for `client_timeout_s` is given up too. The caller aborts the requests of a client
given up, so a vanished client stops costing compute.

Sockets are bounded: at most `max_clients` are kept; the least recently used idle one is closed
to make room, and the context's socket limit is sized to the bound, so no number of clients can
exhaust it. Sockets connect with ZMQ_IMMEDIATE: a message is only queued on a live connection,
which is what makes a dead client visible at once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import zmq

from aioworker.wire.drops import DropCounter
from aioworker.wire.protocol import encode

log = logging.getLogger(__name__)


class InvalidReplyEndpoint(ValueError):
    """reply_to is not an endpoint we can connect to."""


# While outputs wait in an outbox, how often they are tried again.
RETRY_INTERVAL_S = 0.002
# An outbox stalled this long has its client probed (is anything listening at reply_to?).
PROBE_AFTER_S = 1.0

# (reply_to, the client's authenticated key or None) -> options of the PUSH socket to it.
SocketOptionsFn = Callable[[str, str | None], Mapping[int, int | bytes]]
# Where a request's outputs go: its reply_to endpoint, and with CURVE the key it came with
# (its results go only to that key).
ClientAddress = tuple[str, str | None]


@dataclass(slots=True)
class _ClientLink:
    sock: zmq.Socket
    outbox: collections.deque[list[bytes]] = field(default_factory=collections.deque)
    # time.monotonic() when the outbox last moved (or filled up, if it has not moved since).
    stalled_since: float = 0.0
    probed_at: float = 0.0


class ResultSender:
    def __init__(
        self,
        hwm: int,
        socket_options: SocketOptionsFn | None = None,
        max_clients: int = 256,
        client_timeout_s: float = 5.0,
    ) -> None:
        # A plain (non-asyncio) context: sends use NOBLOCK and must not wait on the loop.
        self._context = zmq.Context()
        # Room for the kept sockets (up to twice the bound while outputs wait in every one),
        # and as many again still lingering after their close.
        self._context.set(zmq.MAX_SOCKETS, 3 * max_clients + 16)
        self._hwm = hwm
        self._socket_options = socket_options or (lambda endpoint, client_key: {})
        self.max_clients = max_clients
        self.client_timeout_s = client_timeout_s
        # One link per client: with CURVE the same endpoint under another key is another peer.
        self._links: OrderedDict[ClientAddress, _ClientLink] = OrderedDict()
        self._waiting: set[ClientAddress] = set()  # clients whose outbox is not empty
        self._given_up: list[ClientAddress] = []  # closed to make room with outputs waiting
        self._outbox_filled: asyncio.Event | None = None
        self.drops = DropCounter(log, "outputs")
        self.recorder = None  # a runtime.recorder.Recorder when recording

    @property
    def num_sockets(self) -> int:
        return len(self._links)

    @property
    def num_waiting_clients(self) -> int:
        return len(self._waiting)

    def check_endpoint(self, endpoint: str, client_key: str | None = None) -> None:
        """Raises InvalidReplyEndpoint when no socket could reach `endpoint`; makes none."""
        if not endpoint.startswith(("ipc://", "tcp://")):
            raise InvalidReplyEndpoint(
                f"reply_to {endpoint!r} must be an ipc:// or tcp:// endpoint"
            )
        try:
            self._socket_options(endpoint, client_key)
        except ValueError as exc:
            raise InvalidReplyEndpoint(str(exc)) from exc

    def send(self, endpoint: str, message, client_key: str | None = None) -> bool:
        """Send now, or queue behind what waits for this client; False if it cannot be sent."""
        frames = encode(message)
        try:
            link = self._link((endpoint, client_key))
        except InvalidReplyEndpoint as exc:
            self.drops.count(str(exc))
            return False
        if self.recorder is not None:
            self.recorder.write("output", frames)
        if link.outbox or not _try_send(link.sock, frames):
            if not link.outbox:
                link.stalled_since = time.monotonic()
                self._waiting.add((endpoint, client_key))
                if self._outbox_filled is not None:
                    self._outbox_filled.set()
            link.outbox.append(frames)
        return True

    async def run(self, on_gone: Callable[[ClientAddress], None]) -> None:
        """Keep trying what waits in outboxes; tell `on_gone` of every client given up."""
        self._outbox_filled = asyncio.Event()
        while True:
            if not self._waiting:
                self._outbox_filled.clear()
                await self._outbox_filled.wait()
            for client in self.flush():
                on_gone(client)
            for client in await self._probe_stalled():
                on_gone(client)
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def _probe_stalled(self) -> list[ClientAddress]:
        """Stalled clients whose reply_to nobody listens at any more: given up now."""
        now, gone = time.monotonic(), []
        for client in list(self._waiting):
            link = self._links[client]
            if now - link.stalled_since < PROBE_AFTER_S or now - link.probed_at < PROBE_AFTER_S:
                continue
            link.probed_at = now
            # In a thread: a tcp connect to a host that went away can take a moment.
            listening = await asyncio.to_thread(is_listening, client[0])
            if not listening and client in self._links:  # (it may have closed meanwhile)
                self._close_link(client, linger_ms=0)
                gone.append(client)
                self.drops.count(f"{client[0]}: nothing listens there any more")
        return gone

    def flush(self, now: float | None = None) -> list[ClientAddress]:
        """Send what waits in outboxes; returns the clients given up (stalled too long), whose
        links are closed and whose waiting outputs are discarded."""
        now = time.monotonic() if now is None else now
        gone, self._given_up = self._given_up, []
        for client in list(self._waiting):
            link = self._links[client]
            sent = False
            while link.outbox and _try_send(link.sock, link.outbox[0]):
                link.outbox.popleft()
                sent = True
            if not link.outbox:
                self._waiting.discard(client)
            elif sent:
                link.stalled_since = now
            elif now - link.stalled_since > self.client_timeout_s:
                gone.append(client)
                self._close_link(client, linger_ms=0)
                self.drops.count(f"{client[0]}: read nothing for {self.client_timeout_s:g}s")
        return gone

    def close(self, linger_ms: int = 1000) -> None:
        """Close every socket, giving queued outputs `linger_ms` to leave."""
        for link in self._links.values():
            for frames in link.outbox:
                _try_send(link.sock, frames)
            link.sock.close(linger=linger_ms)
        self._links.clear()
        self._context.term()

    def _link(self, client: ClientAddress) -> _ClientLink:
        link = self._links.get(client)
        if link is not None:
            self._links.move_to_end(client)
            return link
        self._make_room()
        link = _ClientLink(self._connect(*client))
        self._links[client] = link
        return link

    def _make_room(self) -> None:
        """Close idle links, least recently used first, until one more fits. Links with outputs
        waiting may take up to twice the bound; past that the least recently used is given up."""
        for client in [c for c, link in self._links.items() if not link.outbox]:
            if len(self._links) < self.max_clients:
                return
            self._close_link(client, linger_ms=1000)
        if len(self._links) >= 2 * self.max_clients:
            oldest = next(iter(self._links))
            self._close_link(oldest, linger_ms=0)
            self._given_up.append(oldest)
            self.drops.count(f"{oldest[0]}: closed to make room for a new client")

    def _connect(self, endpoint: str, client_key: str | None) -> zmq.Socket:
        self.check_endpoint(endpoint, client_key)
        sock = self._context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        try:
            for option, value in self._socket_options(endpoint, client_key).items():
                sock.setsockopt(option, value)
            sock.connect(endpoint)
        except (zmq.ZMQError, ValueError) as exc:
            sock.close()
            raise InvalidReplyEndpoint(f"cannot connect to reply_to {endpoint!r}: {exc}") from exc
        return sock

    def _close_link(self, client: ClientAddress, linger_ms: int) -> None:
        self._waiting.discard(client)
        self._links.pop(client).sock.close(linger=linger_ms)


def is_listening(endpoint: str) -> bool:
    """Whether a process still accepts connections at an ipc or tcp endpoint."""
    try:
        if endpoint.startswith("ipc://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.5)
                probe.connect(endpoint.removeprefix("ipc://"))
        else:
            parts = urlsplit(endpoint)
            socket.create_connection((parts.hostname, parts.port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _try_send(sock: zmq.Socket, frames: list[bytes]) -> bool:
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True
