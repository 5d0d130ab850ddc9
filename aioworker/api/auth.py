"""Bearer-token authentication (`api.api_key`, `--api-key`, AIOWORKER_API_KEY): a raw ASGI layer
in front of every route but /health, which a load balancer must reach without a key. The token
is compared in constant time."""

from __future__ import annotations

import hmac

from aioworker.api.asgi import App, Receive, Scope, Send, send_error
from aioworker.api.errors import ApiError

OPEN_PATHS = frozenset({"/health"})


class BearerAuth:
    def __init__(self, app: App, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = authorization(scope)
            if given is None or not hmac.compare_digest(given, self.expected):
                await send_error(send, unauthorized(given is None))
                return
        await self.app(scope, receive, send)


def authorization(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value
    return None


def unauthorized(missing: bool) -> ApiError:
    what = "no Authorization header came" if missing else "the API key is not this server's"
    return ApiError(
        401,
        f"{what}: send `Authorization: Bearer <key>` with the key the server was started with "
        "(--api-key, api.api_key or AIOWORKER_API_KEY)",
        error_type="invalid_request_error",
        headers={"WWW-Authenticate": "Bearer"},
    )
