"""With an API key, every route but /health asks for it as a bearer token, and refuses without
it in OpenAI's error shape."""

from __future__ import annotations

import http.client
import json

import pytest

from aioworker.checkpoint.tokenizer import Tokenizer
from tests.api.inprocess import MODEL, ServedGateway

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedded_model_dir):
    tokenizer = Tokenizer(embedded_model_dir)
    with ServedGateway(tmp_path_factory.mktemp("auth"), tokenizer, {"api.api_key": KEY}) as served:
        yield served


def call(served, method: str, path: str, key: str | None, body: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    conn.request(method, path, json.dumps(body).encode() if body else None, headers)
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
        ("POST", "/tokenize", {"prompt": "Hi"}),
    ],
)
def test_every_route_but_health_needs_the_key(served, method, path, body) -> None:
    for wrong in (None, "nope", KEY + "x"):
        status, headers, raw = call(served, method, path, wrong, body)
        error = json.loads(raw)["error"]
        assert status == 401 and "Bearer" in error["message"], (wrong, raw)
        assert headers.get("www-authenticate") == "Bearer"
    assert call(served, method, path, KEY, body)[0] == 200


def test_health_needs_no_key(served) -> None:
    assert call(served, "GET", "/health", None)[0] == 200
