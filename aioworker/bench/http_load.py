"""A lean HTTP/1.1 client for load: keep-alive connections on asyncio streams that POST a
streaming request and read its server-sent events, timing the first event and the end. Lean so
that the load generator, not the server, is the smaller cost on a shared machine."""

from __future__ import annotations

import asyncio
import time

import msgspec

# A streamed answer ends with the [DONE] event and the empty chunk of chunked encoding.
END = b"data: [DONE]\n\n\r\n0\r\n\r\n"
FIRST_EVENT = b"data: "


class StreamingConnection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        self.writer.close()

    async def post(self, path: str, body: dict) -> tuple[float, float]:
        """Seconds to the first event and to the end of the stream."""
        payload = msgspec.json.encode(body)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode()
        started = time.perf_counter()
        self.writer.write(head + payload)
        received = b""
        first = None
        while True:
            chunk = await self.reader.read(65536)
            if not chunk:
                raise ConnectionError(f"the server closed the connection: {received[-300:]!r}")
            received += chunk
            if first is None and FIRST_EVENT in received:
                first = time.perf_counter() - started
            if received.endswith(END):
                break
            if received.startswith(b"HTTP/1.1 ") and not received.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(f"the server answered {received[:300]!r}")
        return first, time.perf_counter() - started
