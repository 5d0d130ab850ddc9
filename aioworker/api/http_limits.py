"""The HTTP limits uvicorn's httptools protocol lacks, in a subclass of it (httptools parses
faster than h11, whose size limit is the only one uvicorn has): a request head must arrive whole
within `api.header_timeout_s` of the connection opening or of the previous answer (else the
connection is closed), it may hold at most `api.max_header_bytes` and `api.max_headers` headers
(431), and past `api.max_connections` open connections a new one is answered 503 and closed.

Idle keep-alive connections are closed by uvicorn's own timer (`timeout_keep_alive`); bodies are
bounded by body_limit.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from aioworker.api.errors import ApiError
from aioworker.config import ApiOptions


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float
    max_header_bytes: int
    max_headers: int
    max_connections: int

    @classmethod
    def from_options(cls, options: ApiOptions) -> HttpLimits:
        return cls(
            options.header_timeout_s,
            options.max_header_bytes,
            options.max_headers,
            options.max_connections,
        )


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a head we refuse."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._head_timer: asyncio.TimerHandle | None = None
        # Whether the bytes coming are a request head, and how many of them have come.
        self._reading_head = True
        self._head_bytes = 0
        self._num_headers = 0
        self._refusal: ApiError | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                ApiError(
                    503,
                    f"this server has {self.limits.max_connections} connections open already "
                    "(api.max_connections); retry later",
                    error_type="service_unavailable_error",
                )
            )
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            # Counted before parsing: httptools buffers a header it has not finished whole.
            self._head_bytes += len(data)
            if self._head_timer is None:
                self._arm_head_timer()  # the first bytes of a request on a kept-alive connection
        super().data_received(data)
        if self._reading_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(self._head_too_large(f"more than {self.limits.max_header_bytes} bytes"))

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        self._num_headers = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._num_headers += 1
        if self._num_headers > self.limits.max_headers:
            self._refusal = ApiError(
                431,
                f"the request has more than {self.limits.max_headers} headers (api.max_headers)",
            )
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._cancel_head_timer()
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            self._refusal = self._head_too_large(f"{size} bytes")
            raise _Refused
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        self._head_bytes = 0

    # -- refusals -----------------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head the parser failed on, which is where a callback's refusal
        lands too."""
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(refusal)

    def _head_too_large(self, size: str) -> ApiError:
        return ApiError(
            431,
            f"the request head has {size}; this server takes at most "
            f"{self.limits.max_header_bytes} (api.max_header_bytes)",
        )

    def _refuse(self, error: ApiError) -> None:
        """Answer `error` and close, unless an answer is being written on this connection (then
        only close: bytes of ours would corrupt it)."""
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            body = error.body()
            head = [
                STATUS_LINE[error.status],
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
        self.transport.close()

    # -- the head timer -----------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._reading_head and not self.transport.is_closing():
            self.transport.close()
