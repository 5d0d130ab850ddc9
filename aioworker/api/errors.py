"""Errors as OpenAI's API shapes them: an HTTP status and `{"error": {message, type, param,
code}}`, with a message that names the field and its limit."""

from __future__ import annotations

import msgspec

from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput

# What a worker's error kind becomes over HTTP, and OpenAI's type for it.
STATUS_OF_KIND = {
    ErrorKind.INVALID: (400, "invalid_request_error"),
    ErrorKind.OVERLOADED: (429, "rate_limit_error"),
    ErrorKind.UNAVAILABLE: (503, "service_unavailable_error"),
    ErrorKind.INTERNAL: (500, "internal_error"),
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        error_type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type
        self.headers = headers or {}

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.error_type, "param": self.param}
        return msgspec.json.encode({"error": {**error, "code": self.status}})


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, error_type="service_unavailable_error")


def from_output(out: RequestOutput, retry_after_s: int) -> ApiError:
    """The HTTP error for a request the workers ended without finishing it (ERROR or ABORT)."""
    if out.finish_reason == FinishReason.ABORT:
        return unavailable(f"the request was aborted in the worker: {out.error}; retry it")
    status, error_type = STATUS_OF_KIND[out.error_kind or ErrorKind.INTERNAL]
    headers = {"Retry-After": str(retry_after_s)} if status == 429 else None
    return ApiError(status, out.error or "the request failed", None, error_type, headers)
