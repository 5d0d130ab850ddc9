"""Outputs go to each request's `reply_to` endpoint: one PUSH socket per endpoint, reused.

Sends never block the loop: a client that stops reading fills its queue (`runtime.result_hwm`)
and further outputs for it are dropped, counted and logged, so one stuck client cannot stall
the group.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping

import zmq

from aioworker.runtime.drops import DropCounter
from aioworker.wire.protocol import encode

log = logging.getLogger(__name__)

_MAX_SOCKETS = 4096


class InvalidReplyEndpoint(ValueError):
    """reply_to is not an endpoint we can connect to."""


# (reply_to, the client's authenticated key or None) -> options of the PUSH socket to it.
SocketOptionsFn = Callable[[str, str | None], Mapping[int, int | bytes]]


class ResultSender:
    def __init__(self, hwm: int, socket_options: SocketOptionsFn | None = None) -> None:
        # A plain (non-asyncio) context: sends use NOBLOCK and must not wait on the loop.
        self._context = zmq.Context()
        self._hwm = hwm
        self._socket_options = socket_options or (lambda endpoint, client_key: {})
        # One socket per client: with CURVE the same endpoint under another key is another peer.
        self._sockets: OrderedDict[tuple[str, str | None], zmq.Socket] = OrderedDict()
        self.drops = DropCounter(log, "outputs")
        self.recorder = None  # a runtime.recorder.Recorder when recording

    def check_endpoint(self, endpoint: str, client_key: str | None = None) -> None:
        if not endpoint.startswith(("ipc://", "tcp://")):
            raise InvalidReplyEndpoint(
                f"reply_to {endpoint!r} must be an ipc:// or tcp:// endpoint"
            )
        self._socket(endpoint, client_key)

    def send(self, endpoint: str, message, client_key: str | None = None) -> bool:
        try:
            sock = self._socket(endpoint, client_key)
            frames = encode(message)
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
            if self.recorder is not None:
                self.recorder.write("output", frames)
            return True
        except (zmq.Again, InvalidReplyEndpoint):
            self.drops.count(f"{endpoint}: client not reading or unreachable")
            return False

    def _socket(self, endpoint: str, client_key: str | None) -> zmq.Socket:
        client = (endpoint, client_key)
        sock = self._sockets.get(client)
        if sock is not None:
            self._sockets.move_to_end(client)
            return sock
        sock = self._context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        try:
            for option, value in self._socket_options(endpoint, client_key).items():
                sock.setsockopt(option, value)
            sock.connect(endpoint)
        except (zmq.ZMQError, ValueError) as exc:
            sock.close()
            raise InvalidReplyEndpoint(f"cannot connect to reply_to {endpoint!r}: {exc}") from exc
        self._sockets[client] = sock
        if len(self._sockets) > _MAX_SOCKETS:
            _, oldest = self._sockets.popitem(last=False)
            oldest.close()
        return sock

    def close(self, linger_ms: int = 1000) -> None:
        """Close every socket, giving queued outputs `linger_ms` to leave."""
        for sock in self._sockets.values():
            sock.close(linger=linger_ms)
        self._sockets.clear()
        self._context.term()
