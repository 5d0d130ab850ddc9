"""The FastAPI application: the OpenAI routes, vLLM's tokenize routes, health, version and metrics,
behind two raw ASGI layers (the bearer key when one is set, then the bounded body). Bodies are
decoded with msgspec (strict, and faster than validating through pydantic), so handlers take the
raw Request."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from aioworker.api.auth import BearerAuth
from aioworker.api.body_limit import BoundedBody
from aioworker.api.disconnect import ClientDisconnected, cancelled_on_disconnect
from aioworker.api.endpoints import Prepared, prepare_chat, prepare_completion
from aioworker.api.errors import ApiError
from aioworker.api.event_stream import EventStream
from aioworker.api.gateway import Gateway
from aioworker.api.token_routes import detokenize, tokenize
from aioworker.version import __version__
from aioworker.wire.protocol import PROTOCOL_VERSION

log = logging.getLogger(__name__)
# Not a real HTTP status: what nginx logs for a client that closed its request (nobody sees it).
CLIENT_CLOSED = 499

Prepare = Callable[[Gateway, bytes, float], Awaitable[Prepared]]


def json_response(payload: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status, media_type="application/json")


def error_response(error: ApiError) -> Response:
    return Response(error.body(), error.status, error.headers, media_type="application/json")


def build_app(gateway: Gateway) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.client.start()
        yield
        await gateway.client.close()  # aborts whatever is still open
        gateway.close()

    app = FastAPI(title="aioworker", version=__version__, lifespan=lifespan)
    add_routes(app, gateway)
    add_error_handlers(app)
    options = gateway.options
    app.add_middleware(
        BoundedBody, max_bytes=options.max_body_bytes, timeout_s=options.body_timeout_s
    )
    if options.api_key:  # added last, so it runs first: no body is read for a request without it
        app.add_middleware(BearerAuth, api_key=options.api_key)
    return app


def add_routes(app: FastAPI, gateway: Gateway) -> None:
    started = int(time.time())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(gateway, request, "completions", prepare_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(gateway, request, "chat", prepare_chat)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        return json_response(await tokenize(gateway, await request.body()))

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> Response:
        return json_response(await detokenize(gateway, await request.body()))

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": model_cards(gateway, started)})

    @app.get("/health")
    async def health() -> Response:
        """200 while some group takes requests (READY, or queuing them), else 503; each group's
        state as its latest heartbeat says, the same `admin status` reports."""
        states = gateway.group_states()
        ready = gateway.is_ready(states)
        groups = [{"group": g, "state": state} for g, state in enumerate(states)]
        return json_response({"ready": ready, "groups": groups}, 200 if ready else 503)

    @app.get("/version")
    async def version() -> Response:
        return json_response({"version": __version__, "protocol_version": PROTOCOL_VERSION})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")


def model_cards(gateway: Gateway, created: int) -> list[dict[str, Any]]:
    """One entry per served name, each naming the model it serves (`root`) and its context."""
    model = gateway.model
    return [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "aioworker",
            "root": model.root,
            "parent": None,
            "max_model_len": model.max_model_len,
        }
        for name in model.names
    ]


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(ApiError(exc.status_code, str(exc.detail), None, "not_found_error"))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        message = f"internal error: {type(exc).__name__}: {exc}"
        return error_response(ApiError(500, message, None, "internal_error"))


async def answer(gateway: Gateway, request: Request, endpoint: str, prepare: Prepare) -> Response:
    arrived = time.perf_counter()
    metrics = gateway.metrics
    metrics.in_flight.inc()
    status = 200
    try:
        await gateway.check_can_serve()  # before anything is paid for: tokenizing, choices
        prepared = await prepare(gateway, await request.body(), arrived)
        response = await respond(gateway, prepared, request, endpoint)
        if isinstance(response, EventStream):
            status = -1  # the stream counts itself when it ends
        return response
    except ApiError as error:
        status = error.status
        return error_response(error)
    except ClientDisconnected:
        status = CLIENT_CLOSED
        metrics.disconnects.inc()
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if status != -1:
            metrics.in_flight.dec()
            metrics.requests.labels(endpoint, status).inc()


async def respond(
    gateway: Gateway, prepared: Prepared, request: Request, endpoint: str
) -> Response:
    """The whole answer, or a stream that has its first events (an error before them is still
    an HTTP error)."""
    run = prepared.run
    await run.submit()
    async with cancelled_on_disconnect(request.receive):
        if not prepared.stream:
            return json_response(await run.collect())
        events = run.events(prepared.include_usage, prepared.continuous_usage)
        first = await anext(events)
    metrics = gateway.metrics

    def on_end(disconnected: bool) -> None:
        metrics.in_flight.dec()
        metrics.requests.labels(endpoint, CLIENT_CLOSED if disconnected else 200).inc()
        if disconnected:
            metrics.disconnects.inc()

    return EventStream(first, events, on_end)
