"""Outputs go to each request's `reply_to` endpoint: one PUSH socket per endpoint, reused.

Sends never block the loop: a client that stops reading fills its queue (`runtime.result_hwm`)
and further outputs for it are dropped, counted and logged, so one stuck client cannot stall
the group.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import zmq

from aioworker.protocol import encode

log = logging.getLogger(__name__)

_MAX_SOCKETS = 4096


class InvalidReplyEndpoint(ValueError):
    """reply_to is not an endpoint we can connect to."""


class ResultSender:
    def __init__(self, hwm: int) -> None:
        # A plain (non-asyncio) context: sends use NOBLOCK and must not wait on the loop.
        self._context = zmq.Context()
        self._hwm = hwm
        self._sockets: OrderedDict[str, zmq.Socket] = OrderedDict()
        self.num_dropped = 0

    def check_endpoint(self, endpoint: str) -> None:
        if not endpoint.startswith(("ipc://", "tcp://")):
            raise InvalidReplyEndpoint(
                f"reply_to {endpoint!r} must be an ipc:// or tcp:// endpoint"
            )
        self._socket(endpoint)

    def send(self, endpoint: str, message) -> bool:
        try:
            sock = self._socket(endpoint)
            sock.send_multipart(encode(message), flags=zmq.NOBLOCK)
            return True
        except (zmq.Again, InvalidReplyEndpoint):
            self.num_dropped += 1
            log.warning(
                "dropped an output for %s (client not reading or unreachable); %d dropped so far",
                endpoint,
                self.num_dropped,
            )
            return False

    def _socket(self, endpoint: str) -> zmq.Socket:
        sock = self._sockets.get(endpoint)
        if sock is not None:
            self._sockets.move_to_end(endpoint)
            return sock
        sock = self._context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise InvalidReplyEndpoint(f"cannot connect to reply_to {endpoint!r}: {exc}") from exc
        self._sockets[endpoint] = sock
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
