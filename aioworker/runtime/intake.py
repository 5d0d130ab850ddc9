"""The driver's request intake: decode task frames, admit or refuse requests with a reason,
abort them, and send terminal outputs. Every request gets exactly one terminal output."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import msgspec

from aioworker.core.sampling_params import InvalidRequestError
from aioworker.core.sequence import Sequence
from aioworker.runtime.results import InvalidReplyEndpoint
from aioworker.runtime.state import RankState
from aioworker.wire.protocol import (
    MAX_REQUEST_ID_LENGTH,
    TASK_DECODER,
    AbortRequest,
    Outputs,
    ProtocolError,
    Rejected,
    SubmitRequest,
    TokenDelta,
)
from aioworker.wire.security import recv_with_client_key

log = logging.getLogger(__name__)

# Frames taken from a socket before other coroutines get a turn.
YIELD_EVERY = 32


@dataclass(slots=True)
class Request:
    seq: Sequence
    reply_to: str
    arrival: float  # time.monotonic() at admission
    first_token_at: float | None = None
    # The z85 key the request was authenticated with (CURVE); its results go only to that key.
    client_key: str | None = None


class RequestIntake:
    """Mixed into Driver: uses its scheduler, results sender, requests and metrics."""

    # -- requests -----------------------------------------------------------------------------

    async def task_loop(self) -> None:
        received = 0
        while True:
            frames, client_key = await recv_with_client_key(self.tasks)
            received += 1
            if received % YIELD_EVERY == 0:
                # Awaiting a socket with queued frames does not yield: without this, a burst
                # would starve the step loop and the heartbeat (and peers would think us dead).
                await asyncio.sleep(0)
            if self.recorder is not None:
                self.recorder.write("task", frames)
            try:
                message = TASK_DECODER.decode(frames)
            except ProtocolError as exc:
                self.reject_frame(frames, exc, client_key)
                continue
            if isinstance(message, SubmitRequest):
                self.on_submit(message, client_key)
            elif isinstance(message, AbortRequest):
                self.abort(message.request_id, "aborted by the client")

    def on_submit(self, message: SubmitRequest, client_key: str | None = None) -> None:
        request_id, reply_to = message.request_id, message.reply_to
        try:
            self.results.check_endpoint(reply_to, client_key)
        except InvalidReplyEndpoint as exc:
            self.count_rejected("tasks", exc)
            return
        error = self.admission_error(message)
        if error is not None:
            self.send_terminal(reply_to, request_id, "error", error, client_key)
            return
        seq = Sequence(
            next(self.seq_ids),
            request_id,
            message.prompt_token_ids,
            message.params,
            self.loaded.eos_token_ids,
        )
        self.scheduler.add(seq)
        self.requests[request_id] = Request(seq, reply_to, time.monotonic(), client_key=client_key)
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(message.prompt_token_ids))
        self.work.set()

    def admission_error(self, message: SubmitRequest) -> str | None:
        if not self.state.accepts_requests:
            return f"worker is {self.state.lower()}: not accepting requests; retry on another group"
        released = self.state is RankState.WEIGHTS_CLEARED
        if released and self.config.runtime.while_released == "reject":
            return "worker has released its memory (admin release-memory); retry later or on another group"
        if not message.request_id or len(message.request_id) > MAX_REQUEST_ID_LENGTH:
            return f"request_id must have 1 to {MAX_REQUEST_ID_LENGTH} characters"
        if message.request_id in self.requests:
            return f"request_id {message.request_id!r} is already in use"
        try:
            self.validator.check(message.prompt_token_ids, message.params)
        except InvalidRequestError as exc:
            return str(exc)
        return None

    def reject_frame(
        self, frames: list[bytes], exc: ProtocolError, client_key: str | None = None
    ) -> None:
        """A frame that failed to decode: answer its reply_to if one can be read, else count it."""
        self.count_rejected("tasks", exc)
        try:
            loose = msgspec.msgpack.decode(frames[-1])
            reply_to, request_id = loose.get("reply_to"), loose.get("request_id")
        except Exception:
            return
        if isinstance(reply_to, str) and isinstance(request_id, str):
            try:
                self.results.check_endpoint(reply_to, client_key)
            except InvalidReplyEndpoint:
                return
            self.send_terminal(reply_to, request_id, "error", f"rejected: {exc}", client_key)
        elif isinstance(reply_to, str):
            self.results.send(reply_to, Rejected(reason=str(exc)), client_key)

    def count_rejected(self, channel: str, exc: Exception) -> None:
        self.rejected.count(f"{channel} channel: {exc}")

    def abort(self, request_id: str, reason: str) -> bool:
        request = self.requests.get(request_id)
        if request is None:
            return False
        self.on_finished(request_id, "abort")
        self.scheduler.abort(request.seq.seq_id)
        self.send_terminal(request.reply_to, request_id, "abort", reason, request.client_key)
        self.maybe_finish_drain()
        return True

    def abort_all(self, reason: str) -> int:
        request_ids = list(self.requests)
        for request_id in request_ids:
            self.abort(request_id, reason)
        return len(request_ids)

    def fail_all(self, reason: str) -> None:
        for request_id, request in list(self.requests.items()):
            self.send_terminal(request.reply_to, request_id, "error", reason, request.client_key)
        self.requests.clear()

    def send_terminal(
        self,
        reply_to: str,
        request_id: str,
        reason: str,
        message: str,
        client_key: str | None = None,
    ) -> None:
        delta = TokenDelta(request_id, [], reason, message, self.weights_version)
        outputs = Outputs(group=self.group, step_id=self.step_id, deltas=[delta])
        self.results.send(reply_to, outputs, client_key)

    # -- stepping -----------------------------------------------------------------------------

    def on_first_token(self, request: Request) -> None:
        request.first_token_at = time.monotonic()
        if self.metrics is not None:
            self.metrics.ttft.observe(request.first_token_at - request.arrival)

    def on_finished(self, request_id: str, reason: str) -> None:
        request = self.requests.pop(request_id)
        if self.metrics is not None:
            self.metrics.on_finished(request.arrival, reason)
