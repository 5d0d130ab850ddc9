"""A whole service for the API tests: `aioworker serve --api-port 0` (ranks and the HTTP
server under one launcher), or a fake worker plus `aioworker api`; and small HTTP helpers on the
standard library."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

from tests.processes import Process

SERVING = re.compile(r"aioworker api: serving .* on (http://[\d.]+:\d+)")


def api_url(process: Process, timeout: float = 60.0) -> str:
    """The address the API server printed when it started listening."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in process.lines:
            if match := SERVING.search(line):
                return match[1]
        assert process.process.poll() is None, (
            f"exited {process.process.returncode}:\n{process.log}"
        )
        time.sleep(0.05)
    raise AssertionError(f"no API server address within {timeout}s:\n{process.log}")


@contextmanager
def healthy(worker: Process, api: Process) -> Iterator[str]:
    """The API server's address once its /health is 200; stops both processes afterwards."""
    try:
        url = api_url(api)
        wait_healthy(url, api, timeout=60)
        yield url
    finally:
        api.stop()
        worker.stop()


def wait_healthy(url: str, process: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if request(url, "GET", "/health")[0] == 200:
                return
        except OSError:
            pass
        assert process.process.poll() is None, f"exited:\n{process.log}"
        time.sleep(0.2)
    raise AssertionError(f"/health not 200 within {timeout}s:\n{process.log}")


def request(
    url: str, method: str, path: str, body: dict | None = None
) -> tuple[int, dict[str, str], bytes]:
    """status, headers (lower-case names), body."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, payload, {"content-type": "application/json"})
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        conn.close()


def open_stream(url: str, path: str, body: dict) -> tuple[socket.socket, bytes]:
    """Send a streaming request on a raw socket; return it with the first bytes of the answer
    (to close it mid-stream, as a client that leaves does)."""
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=60)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parsed.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    received = b""
    while received.count(b"data: ") < 3:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the stream early: {received!r}"
        received += chunk
    return sock, received


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
