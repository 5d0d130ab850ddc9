"""The driver's request intake: decode task frames, admit requests or refuse them with a reason,
and abort them when their client asks. A frame that cannot be decoded, or is too large to be,
is answered when it names where to, and counted either way; the loop goes on."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import zmq.asyncio

from aioworker.config import RuntimeOptions
from aioworker.core.admission import QueueFull
from aioworker.core.guided import MAX_CHOICES, MAX_GUIDED_TEXT
from aioworker.core.outputs import ErrorKind, FinishReason
from aioworker.core.sampling_params import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_STRING_LENGTH,
    MAX_STOP_STRINGS,
    InvalidRequestError,
)
from aioworker.runtime.group_control import GroupControl
from aioworker.runtime.open_requests import OpenRequests
from aioworker.runtime.recorder import Recorder
from aioworker.runtime.reply_policy import ReplyNotAllowed, ReplyPolicy
from aioworker.runtime.results import InvalidReplyEndpoint, ResultSender
from aioworker.wire.drops import DropCounter
from aioworker.wire.health import RankState
from aioworker.wire.protocol import (
    MAX_REQUEST_ID_LENGTH,
    TASK_DECODER,
    VERSION_FRAME,
    AbortRequest,
    ProtocolError,
    Rejected,
    SubmitRequest,
)
from aioworker.wire.security import client_key_of, peer_address_of
from aioworker.wire.submit_head import read_submit_head

log = logging.getLogger(__name__)

# The longest deadline a request may ask for: a week; longer is a typo.
MAX_REQUEST_TIMEOUT_S = 7 * 86400.0
# Frames taken from a socket before other coroutines get a turn.
YIELD_EVERY = 32


# The most the sampling parameters of a valid request take in msgpack: every bounded list full,
# 9 bytes per number, stop strings and the guided text at 4 bytes per character.
MAX_PARAMS_BYTES = (
    9
    * (
        MAX_ALLOWED_TOKEN_IDS
        + 2 * MAX_LOGIT_BIAS_ENTRIES
        + MAX_BAD_WORDS * (MAX_BAD_WORD_TOKENS + 1)
    )
    + MAX_STOP_STRINGS * (4 * MAX_STOP_STRING_LENGTH + 5)
    + 4 * MAX_GUIDED_TEXT
    + 5 * MAX_CHOICES
)


def max_task_frame_bytes(max_model_len: int) -> int:
    """The most a task frame of a valid request can hold: a prompt of max_model_len token ids
    (at most 9 bytes each in msgpack) and the largest valid params, with generous room for the
    id, reply_to and the unbounded fields (stop_token_ids)."""
    return 65536 + 9 * max_model_len + MAX_PARAMS_BYTES


class RequestIntake:
    def __init__(
        self,
        tasks: zmq.asyncio.Socket,
        control: GroupControl,
        requests: OpenRequests,
        results: ResultSender,
        rejected: DropCounter,
        options: RuntimeOptions,
        reply_policy: ReplyPolicy,
        recorder: Recorder | None = None,
    ) -> None:
        self.tasks = tasks
        self.control = control
        self.requests = requests
        self.results = results
        self.rejected = rejected
        self.while_released = options.while_released
        self.recorder = recorder
        self.reply_policy = reply_policy
        self.max_model_len = control.core.validator.max_model_len
        self.max_frame_bytes = max_task_frame_bytes(self.max_model_len)

    async def loop(self) -> None:
        received = 0
        while True:
            raw = await self.tasks.recv_multipart(copy=False)
            received += 1
            if received % YIELD_EVERY == 0:
                # Awaiting a socket with queued frames does not yield: without this, a burst
                # would starve the step loop (and the admin and client sockets).
                await asyncio.sleep(0)
            try:
                self.on_frames(raw)
            except Exception as exc:  # one frame must never end the intake, and the rank
                log.exception("a task frame could not be handled")
                self.rejected.count(f"tasks channel: {type(exc).__name__}: {exc}")

    def on_frames(self, raw: list[zmq.Frame]) -> None:
        size = sum(len(frame) for frame in raw)
        client_key, peer_address = client_key_of(raw[-1]), peer_address_of(raw[-1])
        if size > self.max_frame_bytes:
            self.refuse_large_frame(raw, size, client_key, peer_address)
            return
        frames = [frame.bytes for frame in raw]
        if self.recorder is not None:
            self.recorder.write("task", frames)
        try:
            message = TASK_DECODER.decode(frames)
        except ProtocolError as exc:
            self.reject_frame(frames, exc, client_key, peer_address)
            return
        if isinstance(message, SubmitRequest):
            try:
                self.reply_policy.check(message.reply_to, peer_address)
            except ReplyNotAllowed as exc:  # never connect there, not even to say no
                self.rejected.count(f"tasks channel: {exc}")
                return
            self.on_submit(message, client_key)
        elif isinstance(message, AbortRequest):
            self.on_abort(message.request_id, client_key)

    def on_abort(self, request_id: str, client_key: str | None) -> None:
        """Only the key a request came with may abort it (with CURVE; ipc has no keys)."""
        owner = self.requests.client_of(request_id)
        if owner is not None and owner[1] != client_key:
            self.rejected.count(f"tasks channel: abort of {request_id!r} from another client")
            return
        self.requests.abort(request_id, "aborted by the client")

    def on_submit(self, message: SubmitRequest, client_key: str | None = None) -> None:
        client = (message.reply_to, client_key)
        try:
            self.results.check_endpoint(message.reply_to, client_key)
        except InvalidReplyEndpoint as exc:
            self.rejected.count(f"tasks channel: {exc}")
            return
        if self.requests.client_of(message.request_id) == client:
            # Its own request with this id is in flight: an error output would end that stream.
            reason = f"request_id {message.request_id!r} is already in flight from this client"
            rejected = Rejected(reason=reason, request_id=message.request_id)
            self.results.send(message.reply_to, rejected, client_key)
            return
        refused = self.refusal(message)
        if refused is None:
            try:
                self.requests.admit(
                    message.request_id, message.prompt_token_ids, message.params, client
                )
            except InvalidRequestError as exc:
                refused = ErrorKind.INVALID, str(exc)
            except QueueFull as exc:
                refused = ErrorKind.OVERLOADED, str(exc)
        if refused is not None:
            kind, error = refused
            self.requests.send_terminal(client, message.request_id, FinishReason.ERROR, error, kind)
            return
        if message.timeout_s is not None:
            self.requests.set_timeout(message.request_id, message.timeout_s)
        self.control.wake()

    def refusal(self, message: SubmitRequest) -> tuple[ErrorKind, str] | None:
        """Why this group cannot take the request now, whatever the request says."""
        state = self.control.state
        unavailable = ErrorKind.UNAVAILABLE
        if not self.control.lifecycle.machine.rules.accepts_requests:
            return (
                unavailable,
                f"worker is {state.lower()}: not accepting requests; retry on another group",
            )
        if self.control.drain_pending:
            return unavailable, "worker is draining: not accepting requests; retry on another group"
        if state is RankState.WEIGHTS_CLEARED and self.while_released == "reject":
            return unavailable, (
                "worker has released its memory (admin release-memory); retry later or on another group"
            )
        if not message.request_id or len(message.request_id) > MAX_REQUEST_ID_LENGTH:
            return (
                ErrorKind.INVALID,
                f"request_id must have 1 to {MAX_REQUEST_ID_LENGTH} characters",
            )
        timeout = message.timeout_s
        if timeout is not None and not 0 < timeout <= MAX_REQUEST_TIMEOUT_S:
            return ErrorKind.INVALID, (
                f"timeout_s is {timeout}; it must be in (0, {MAX_REQUEST_TIMEOUT_S:g}] seconds"
            )
        return None

    def refuse_large_frame(
        self, raw: list[zmq.Frame], size: int, client_key: str | None, peer_address: str | None
    ) -> None:
        """A frame larger than any valid request: never decoded (that could hold the loop for
        seconds), but answered from its head, which names the request and where its outputs go."""
        limit = f"{self.max_frame_bytes} (model.max_model_len {self.max_model_len})"
        self.rejected.count(
            f"tasks channel: a frame of {size} bytes; a request needs at most {limit}"
        )
        head = read_submit_head(raw[-1].buffer) if len(raw) == 2 else None
        if head is None or raw[0].bytes != VERSION_FRAME:
            return
        tokens = head.num_prompt_tokens
        if tokens is not None and tokens > self.max_model_len:
            reason = f"prompt has {tokens} tokens; max_model_len is {self.max_model_len}"
        else:
            reason = (
                f"request of {size} bytes is larger than any valid request ({limit} bytes at "
                "most); shorten the prompt or the sampling parameters"
            )
        self.answer_refused(head.reply_to, head.request_id, reason, client_key, peer_address)

    def reject_frame(
        self,
        frames: list[bytes],
        exc: ProtocolError,
        client_key: str | None = None,
        peer_address: str | None = None,
    ) -> None:
        """A frame that failed to decode: answer its reply_to if one can be read (and may be
        answered), else count it."""
        self.rejected.count(f"tasks channel: {exc}")
        try:
            loose = msgspec.msgpack.decode(frames[-1])
            reply_to, request_id = loose.get("reply_to"), loose.get("request_id")
        except Exception:
            return
        if isinstance(reply_to, str) and isinstance(request_id, str):
            self.answer_refused(reply_to, request_id, f"rejected: {exc}", client_key, peer_address)
        elif isinstance(reply_to, str) and self.may_answer(reply_to, client_key, peer_address):
            self.results.send(reply_to, Rejected(reason=str(exc)), client_key)

    def answer_refused(
        self,
        reply_to: str,
        request_id: str,
        reason: str,
        client_key: str | None,
        peer_address: str | None,
    ) -> None:
        """End a request that was never admitted with an invalid-request error, where the reply
        policy lets the driver connect."""
        if self.may_answer(reply_to, client_key, peer_address):
            client = (reply_to, client_key)
            self.requests.send_terminal(
                client, request_id, FinishReason.ERROR, reason, ErrorKind.INVALID
            )

    def may_answer(self, reply_to: str, client_key: str | None, peer_address: str | None) -> bool:
        try:
            self.reply_policy.check(reply_to, peer_address)
            self.results.check_endpoint(reply_to, client_key)
        except (ReplyNotAllowed, InvalidReplyEndpoint):
            return False
        return True
