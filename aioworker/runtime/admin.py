"""Admin commands on the driver (the table is wire/admin_commands.py). Status answers from the
start; the rest once the group serves. Weights and memory commands may take minutes: they are
answered when done, while status and the rest stay live. Every reply leaves after a heartbeat
that carries the state it reports, so a tool that watches heartbeats (a gateway) never sees an
older state than the one the admin command printed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from aioworker.runtime.group_control import GroupControl
from aioworker.runtime.open_requests import OpenRequests
from aioworker.runtime.weights import WeightsCoordinator
from aioworker.wire.admin_commands import LOG_LEVELS, LONG_COMMANDS
from aioworker.wire.drops import DropCounter
from aioworker.wire.health import RankState
from aioworker.wire.protocol import ADMIN_DECODER, AdminReply, AdminRequest, ProtocolError, encode

log = logging.getLogger(__name__)

# A day: longer is a typo, and loop.call_later needs a finite number.
MAX_DRAIN_DEADLINE_S = 86400.0


@dataclass(eq=False)
class _Pending:
    """A command not yet answered: still running (a long one), or its reply waits for a beat."""

    route: list[bytes]
    command: str
    reply: AdminReply | None = None


class AdminHandler:
    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        status: Callable[[], dict[str, Any]],
        spawn: Callable[[Coroutine], asyncio.Task],
        rejected: DropCounter,
        drain_timeout_s: float,
        beat_published: Callable[[], Awaitable[None]],
    ) -> None:
        """`beat_published`: returns once a heartbeat made after the call has left."""
        self.sock = sock
        self.status = status
        self.spawn = spawn
        self.rejected = rejected
        self.drain_timeout_s = drain_timeout_s
        self.beat_published = beat_published
        self.control: GroupControl | None = None
        self.requests: OpenRequests | None = None
        self.weights: WeightsCoordinator | None = None
        # Commands not answered yet: close() answers them, so no caller waits out its timeout.
        self._pending: set[_Pending] = set()

    def serve_group(
        self, control: GroupControl, requests: OpenRequests, weights: WeightsCoordinator
    ) -> None:
        """The group is loaded: every command is answered from now on."""
        self.control, self.requests, self.weights = control, requests, weights

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(0)
            # Not copied: pushed tensors (GBs) arrive as frames after the request.
            frames = await self.sock.recv_multipart(copy=False)
            identity, body = frames[0].bytes, frames[1:]
            # A REQ client puts an empty delimiter before the body; echo it back.
            delimiter = [b""] if body and not len(body[0]) else []
            body = body[len(delimiter) :]
            route = [identity, *delimiter]
            try:
                request = ADMIN_DECODER.decode([frame.bytes for frame in body[:2]])
            except ProtocolError as exc:
                self.rejected.count(f"admin channel: {exc}")
                await self.sock.send_multipart(
                    [*route, *encode(AdminReply(ok=False, message=str(exc)))]
                )
                continue
            pending = _Pending(route, request.command)
            self._pending.add(pending)
            if request.command in LONG_COMMANDS:
                raw_frames = [frame.buffer for frame in body[2:]]
                self.spawn(self._answer_long(pending, request, raw_frames))
                continue
            await self._reply(pending, self.answer(request))

    def answer(self, request: AdminRequest) -> AdminReply:
        """Whatever a handler raises becomes a refusal with the reason: a bad admin frame must
        never end the admin task, and with it the rank."""
        try:
            return self.handle(request)
        except Exception as exc:
            log.exception("admin %s failed", request.command)
            return _failed(request, exc)

    def handle(self, request: AdminRequest) -> AdminReply:
        if request.command == "status":
            data = self.status()
            return AdminReply(ok=True, message=data["state"], data=data)
        if request.command == "set-log-level":
            return set_log_level(request.argument)
        if self.control is None:
            return self._not_ready()
        return getattr(self, _HANDLERS[request.command])(request.argument)

    async def handle_long(self, request: AdminRequest, raw_frames: list[bytes]) -> AdminReply:
        """Weights and memory commands: they hold the group and may take minutes."""
        if self.weights is None:
            return self._not_ready()
        if request.command == "update-weights":
            return await self.weights.update(request, raw_frames)
        if request.command == "release-memory":
            return await self.weights.release(request)
        return await self.weights.resume()

    async def _answer_long(self, pending: _Pending, request, raw_frames: list) -> None:
        try:
            reply = await self.handle_long(request, raw_frames)
        except Exception as exc:
            log.exception("admin %s failed", request.command)
            reply = _failed(request, exc)
        await self._reply(pending, reply)

    async def _reply(self, pending: _Pending, reply: AdminReply) -> None:
        """Send `reply` once a beat with the state it reports has left; should the rank stop
        meanwhile, close() sends it."""
        pending.reply = reply
        await self.beat_published()
        if pending in self._pending:
            self._pending.discard(pending)
            await self.sock.send_multipart([*pending.route, *encode(reply)])

    async def close(self, reason: str) -> None:
        """The rank is stopping: every command not answered yet gets its answer now (a long
        one still running: that it did not finish), so no caller waits out its timeout."""
        pending, self._pending = list(self._pending), set()
        for item in pending:
            reply = item.reply or AdminReply(
                ok=False, message=f"{item.command} not finished: {reason}"
            )
            try:
                await self.sock.send_multipart([*item.route, *encode(reply)], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.warning("could not answer admin %s at shutdown: %s", item.command, exc)

    def _not_ready(self) -> AdminReply:
        state = self.status()["state"]
        return AdminReply(ok=False, message=f"worker is {state.lower()}; try again when READY")

    # -- the short commands -------------------------------------------------------------------

    def pause(self, _: str) -> AdminReply:
        control = self.control
        if control.state is not RankState.READY:
            return AdminReply(ok=False, message=f"cannot pause: worker is {control.state}")
        control.move(RankState.PAUSED)
        return AdminReply(ok=True, message="paused: running requests hold; new ones queue")

    def resume(self, _: str) -> AdminReply:
        control = self.control
        if control.state is not RankState.PAUSED:
            return AdminReply(
                ok=False, message=f"cannot resume: worker is {control.state}, not PAUSED"
            )
        control.move(RankState.READY)
        control.wake()
        return AdminReply(ok=True, message="resumed")

    def drain(self, argument: str) -> AdminReply:
        deadline = parse_drain_deadline(argument) if argument else self.drain_timeout_s
        if deadline is None:
            return AdminReply(
                ok=False,
                message=f"drain deadline {argument!r} is not a number of seconds from 0 to "
                f"{MAX_DRAIN_DEADLINE_S:g}",
            )
        in_flight = len(self.requests)
        outcome = self.control.start_drain(deadline)
        return AdminReply(
            ok=True,
            message=f"drain of {in_flight} request(s), deadline {deadline:g}s: {outcome}",
        )

    def abort(self, request_id: str) -> AdminReply:
        if self.requests.abort(request_id, "aborted by an operator"):
            return AdminReply(ok=True, message=f"aborted {request_id}")
        return AdminReply(ok=False, message=f"no request {request_id!r} in flight")

    def reset_prefix_cache(self, _: str) -> AdminReply:
        dropped = self.control.core.reset_prefix_cache()
        return AdminReply(
            ok=True, message=f"prefix cache reset: {dropped} cached block(s) forgotten"
        )

    def shutdown(self, _: str) -> AdminReply:
        count = self.requests.abort_all("worker shutting down")
        self.control.stop()
        return AdminReply(ok=True, message=f"shutting down; aborted {count} request(s)")


def parse_drain_deadline(argument: str) -> float | None:
    """Seconds from 0 to MAX_DRAIN_DEADLINE_S, or None (NaN, infinite, negative, not a number)."""
    try:
        deadline = float(argument)
    except ValueError:
        return None
    return deadline if 0.0 <= deadline <= MAX_DRAIN_DEADLINE_S else None


def _failed(request: AdminRequest, exc: Exception) -> AdminReply:
    return AdminReply(ok=False, message=f"{request.command} failed: {type(exc).__name__}: {exc}")


def set_log_level(level: str) -> AdminReply:
    if level.upper() not in LOG_LEVELS:
        return AdminReply(
            ok=False, message=f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}"
        )
    logging.getLogger().setLevel(level.upper())
    return AdminReply(ok=True, message=f"log level set to {level.upper()}")


# The short commands of wire/admin_commands.py besides status and set-log-level (tested), and
# the AdminHandler method that answers each.
_HANDLERS = {name: name for name in ("pause", "resume", "drain", "abort", "shutdown")}
_HANDLERS["reset-prefix-cache"] = "reset_prefix_cache"
