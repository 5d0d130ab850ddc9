"""HTTP timeouts and limits, driven over raw sockets against a live server with short timeouts:
half-open connections and unfinished heads are closed, a body that lies about its length or
never comes is answered, oversized heads are refused, idle keep-alive connections are closed,
and connections past the limit are turned away."""

from __future__ import annotations

import json

import pytest

from aioworker.checkpoint.tokenizer import Tokenizer
from tests.api.inprocess import ServedGateway, raw_connection, read_until_closed

LIMITS = {
    "api.header_timeout_s": 0.5,
    "api.body_timeout_s": 0.5,
    "api.keep_alive_timeout_s": 0.5,
    "api.max_header_bytes": 16384,
    "api.max_headers": 50,
    "api.max_connections": 4,
    "api.max_body_bytes": 65536,
}
# Bounds within which a loaded 2-core machine still answers; without the limits each case
# waits out the 10 s socket timeout (or forever).
SLACK_S = 3.0


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedded_model_dir):
    tokenizer = Tokenizer(embedded_model_dir)
    with ServedGateway(tmp_path_factory.mktemp("limits"), tokenizer, LIMITS, False) as served:
        yield served


def status_and_error(received: bytes) -> tuple[int, dict]:
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body)["error"] if body else {}


def test_a_half_open_connection_is_closed_after_the_header_timeout(served) -> None:
    with raw_connection(served.url) as sock:
        received, waited = read_until_closed(sock, 10)
    assert received == b"" and waited < 0.5 + SLACK_S


def test_a_head_that_never_ends_is_closed(served) -> None:
    with raw_connection(served.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        received, waited = read_until_closed(sock, 10)
    assert received == b"" and waited < 0.5 + SLACK_S


def test_a_huge_content_length_is_refused_before_reading(served) -> None:
    with raw_connection(served.url) as sock:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"
        sock.sendall(head + b'{"model": "embedded"')
        received, waited = read_until_closed(sock, 10)
    status, error = status_and_error(received)
    assert status == 413 and "99999999999" in error["message"], received
    assert b"connection: close" in received.lower() and waited < SLACK_S


def test_a_body_shorter_than_its_length_is_answered_408(served) -> None:
    with raw_connection(served.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        received, waited = read_until_closed(sock, 10)
    status, error = status_and_error(received)
    assert status == 408 and "did not arrive within 0.5s" in error["message"]
    assert waited < 0.5 + SLACK_S


def test_a_chunked_body_over_the_bound_is_refused_while_reading(served) -> None:
    with raw_connection(served.url) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"a" * 32768
        for _ in range(3):  # 96 KiB: over the 64 KiB bound on the third chunk
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        received, _ = read_until_closed(sock, 10)
    status, error = status_and_error(received)
    assert status == 413 and "65536" in error["message"]


@pytest.mark.parametrize(
    ("headers", "what"),
    [
        (b"X-Big: " + b"a" * 200_000 + b"\r\n", "at most 16384"),
        (b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)), "more than 50 headers"),
    ],
)
def test_too_large_a_head_is_refused_431(served, headers: bytes, what: str) -> None:
    with raw_connection(served.url) as sock:
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we still sent: the answer is already waiting
        received, waited = read_until_closed(sock, 10)
    status, error = status_and_error(received)
    assert status == 431 and what in error["message"] and waited < SLACK_S


def test_an_idle_keep_alive_connection_is_closed(served) -> None:
    with raw_connection(served.url) as sock:
        sock.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        received, waited = read_until_closed(sock, 10)
    assert received.startswith(b"HTTP/1.1 200") and waited < 0.5 + SLACK_S


def test_connections_past_the_limit_are_answered_503(served) -> None:
    held = [raw_connection(served.url) for _ in range(4)]
    try:
        with raw_connection(served.url) as extra:
            received, _ = read_until_closed(extra, 10)
        status, error = status_and_error(received)
        assert status == 503 and "api.max_connections" in error["message"]
    finally:
        for sock in held:
            sock.close()
