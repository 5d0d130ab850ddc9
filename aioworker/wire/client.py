"""The async client library: submit requests to one or more worker groups, stream their outputs,
abort them. Torch-free.

    async with Client.from_config(config) as client:
        stream = await client.submit(prompt_token_ids, SamplingParams(max_tokens=32))
        async for out in stream:
            print(out.token_ids, out.finish_reason)

The client binds one PULL socket for results and connects a PUSH socket to each group's task
endpoint. It sends each request to the group with the fewest of its requests in flight, so it
always knows which group to send an abort to. With [security] keys (tcp), every one of these
sockets uses CURVE: see security.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid

import zmq
import zmq.asyncio

from aioworker.config import WorkerConfig
from aioworker.core.outputs import Completion, ErrorKind, FinishReason, RequestOutput
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams
from aioworker.wire.drops import DropCounter
from aioworker.wire.group_watch import GroupWatch
from aioworker.wire.health import STALE_AFTER_INTERVALS, takes_requests
from aioworker.wire.protocol import (
    RESULT_DECODER,
    AbortRequest,
    Heartbeat,
    Outputs,
    ProtocolError,
    SubmitRequest,
    encode,
)
from aioworker.wire.request_stream import OpenSamples, RequestStream
from aioworker.wire.routing import pick_group, refusal
from aioworker.wire.security import ClientSecurity, stop_authenticator
from aioworker.wire.transport import (
    all_group_endpoints,
    bound_endpoint,
    client_reply_endpoint,
    driver_heartbeat_endpoint,
    make_socket,
    remove_ipc_file,
)

log = logging.getLogger(__name__)


# At most this many result messages are taken per wake-up of the reader before consumers run.
RESULTS_PER_WAKE = 16
# A request with a deadline ends here this long after it, if its group has not ended it.
DEADLINE_GRACE_S = 2.0
# How often a request that arrived before its groups' first beats looks for them again.
FIRST_BEAT_POLL_S = 0.005


class Client:
    def __init__(
        self,
        task_endpoints: list[str],
        reply_endpoint: str,
        security: ClientSecurity | None = None,
        heartbeat_endpoints: list[str] | None = None,
        first_beat_timeout_s: float = 5.0,
        heartbeat_interval_s: float = 1.0,
        max_message_bytes: int = 64 << 20,
        while_released: str = "queue",
    ) -> None:
        """`heartbeat_endpoints`: each group's driver heartbeat (by default derived from its
        task endpoint); a group silent for as long as its last beat allows
        (health.stale_after_s), or with no beat within
        `first_beat_timeout_s`, has its open requests ended with an error.
        `max_message_bytes`: the groups' runtime.max_message_bytes; a larger request is
        refused here (a group would cut the connection off unread). `while_released`: theirs
        too (whether a group that released its memory queues requests)."""
        if not task_endpoints:
            raise ValueError("a client needs at least one group's task endpoint")
        self.task_endpoints = task_endpoints
        self.reply_endpoint = reply_endpoint
        self.security = security or ClientSecurity()
        self.heartbeat_endpoints = heartbeat_endpoints or [
            driver_heartbeat_endpoint(e) for e in task_endpoints
        ]
        self.first_beat_timeout_s = first_beat_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_message_bytes = max_message_bytes
        self.while_released = while_released
        self._queues: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._open: dict[str, OpenSamples] = {}
        self._deadlines: dict[str, asyncio.TimerHandle] = {}
        self._owner: dict[str, int] = {}
        self._in_flight = [0] * len(task_endpoints)
        self._round_robin = itertools.cycle(range(len(task_endpoints)))
        self._started = False
        # Outputs for requests that had already ended: must stay 0 (one terminal output each).
        self.num_unexpected_outputs = 0
        self.unsent = DropCounter(log, "aborts the groups may not have received")

    @classmethod
    def from_config(cls, config: WorkerConfig) -> Client:
        groups = all_group_endpoints(
            config.runtime, config.parallel.tensor_parallel_size, config.parallel.data_parallel_size
        )
        return cls(
            [g.tasks for g in groups],
            client_reply_endpoint(config.runtime),
            ClientSecurity.from_config(config),
            [g.heartbeats[0] for g in groups],
            max(2.0, STALE_AFTER_INTERVALS * config.runtime.heartbeat_interval_s),
            config.runtime.heartbeat_interval_s,
            config.runtime.max_message_bytes,
            config.runtime.while_released,
        )

    async def start(self) -> None:
        if self._started:
            return
        self._context = zmq.asyncio.Context()
        # Before the result socket binds: only the driver's key may deliver results.
        self._authenticator = self.security.start_authenticator(self._context)
        self._results = make_socket(
            self._context,
            zmq.PULL,
            bind=self.reply_endpoint,
            options=self.security.result_options(self.reply_endpoint),
        )
        self.reply_endpoint = bound_endpoint(self._results)
        self._pushes = [
            make_socket(
                self._context, zmq.PUSH, connect=e, options=self.security.connect_options(e)
            )
            for e in self.task_endpoints
        ]
        self._watch = GroupWatch(
            self._context,
            self.heartbeat_endpoints,
            self.security,
            self.first_beat_timeout_s,
            self._on_group_lost,
            self.heartbeat_interval_s,
        )
        self._tasks = [
            asyncio.ensure_future(self._read_results()),
            asyncio.ensure_future(self._watch.run()),
        ]
        self._started = True

    async def close(self) -> None:
        """Abort what is still open (nobody will read it), close the sockets, and remove this
        client's ipc socket file."""
        if not self._started:
            return
        for request_id in list(self._queues):
            self.abort_nowait(request_id)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle in self._deadlines.values():
            handle.cancel()
        self._watch.close()
        self._results.close(linger=0)
        for sock in self._pushes:
            sock.close(linger=500)  # let the aborts leave
        stop_authenticator(self._authenticator)
        self._context.term()
        remove_ipc_file(self.reply_endpoint)
        self._started = False

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests -----------------------------------------------------------------------------

    async def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        group: int | None = None,
        timeout_s: float | None = None,
    ) -> RequestStream:
        """Send a request; the stream yields its outputs and ends after the terminal one. With
        `timeout_s` the group aborts it past that deadline (and this client ends it, should the
        group not answer). A request no group could take (a prompt longer than max_model_len,
        a lost group) ends at once with an error instead of being sent."""
        await self.start()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in flight on this client")
        message = SubmitRequest(
            request_id=request_id,
            reply_to=self.reply_endpoint,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            timeout_s=timeout_s,
        )
        try:
            frames = encode(message)
        except OverflowError as exc:  # before anything is registered: nothing to clean up
            raise InvalidRequestError(
                f"an integer of the request does not fit in 64 bits ({exc}); token ids, "
                "max_tokens and seeds must"
            ) from None
        group = self._pick_group() if group is None else group
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[request_id] = queue
        self._open[request_id] = OpenSamples(params.n)
        self._owner[request_id] = group
        self._in_flight[group] += 1
        stream = RequestStream(request_id, group, queue, params.n)
        refused = refusal(
            self._watch,
            group,
            len(message.prompt_token_ids),
            len(frames[1]),
            self.max_message_bytes,
        )
        if refused is not None:
            reason, kind = refused
            self._deliver(
                RequestOutput(request_id, [], FinishReason.ERROR, reason, error_kind=kind)
            )
            return stream
        if timeout_s is not None:
            self._deadlines[request_id] = asyncio.get_running_loop().call_later(
                timeout_s + DEADLINE_GRACE_S, self._expire, request_id, timeout_s
            )
        await self._pushes[group].send_multipart(frames)
        return stream

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> Completion:
        """The whole request, collected (one sample: `generate_samples` gives each of n)."""
        if params.n != 1:
            raise ValueError(f"generate collects one sample; n is {params.n}: use generate_samples")
        return (await self.generate_samples(prompt_token_ids, params, request_id))[0]

    async def generate_samples(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> list[Completion]:
        """Each of the request's `n` samples, collected, in sample order."""
        stream = await self.submit(prompt_token_ids, params, request_id)
        completions = [
            Completion(stream.request_id, list(prompt_token_ids), group=stream.group)
            for _ in range(params.n)
        ]
        async for out in stream:
            if out.finish_reason == FinishReason.ERROR:  # ends every sample still open
                for completion in completions:
                    if completion.finish_reason is None:
                        completion.add(out)
            else:
                completions[out.sample_index].add(out)
        return completions

    async def abort(self, request_id: str) -> None:
        """Ask the owning group to abort; the request's stream then ends with reason "abort"."""
        group = self._owner.get(request_id)
        if group is not None:
            await self._pushes[group].send_multipart(encode(AbortRequest(request_id=request_id)))

    def abort_nowait(self, request_id: str) -> None:
        """abort() without waiting, from code that cannot await (a cleanup, a callback). Best
        effort: the group may be gone."""
        group = self._owner.get(request_id)
        if group is None:
            return
        try:
            frames = encode(AbortRequest(request_id=request_id))
            zmq.Socket.shadow(self._pushes[group].underlying).send_multipart(
                frames, flags=zmq.NOBLOCK
            )
        except zmq.ZMQError as exc:
            self.unsent.count(f"abort of {request_id}: {exc}")

    def _end(self, request_id: str, reason: str, kind: ErrorKind = ErrorKind.INTERNAL) -> None:
        """End a request here, with an error its stream sees, and ask its group to abort it."""
        self.abort_nowait(request_id)
        self._deliver(RequestOutput(request_id, [], FinishReason.ERROR, reason, error_kind=kind))

    def _on_group_lost(self, group: int, reason: str) -> None:
        for request_id in [rid for rid, owner in self._owner.items() if owner == group]:
            self._end(request_id, reason, ErrorKind.UNAVAILABLE)

    def _expire(self, request_id: str, timeout_s: float) -> None:
        self._deadlines.pop(request_id, None)
        self._end(request_id, f"no terminal output within the deadline of {timeout_s:g}s")

    @property
    def num_in_flight(self) -> int:
        return len(self._queues)

    def group_states(self) -> list[str]:
        """Each group's state from its driver's heartbeats, read up to the last beat that has
        arrived: a RankState, MISSING before its first beat, or STALE once it has gone silent.
        Empty before start()."""
        if not self._started:
            return []
        self._watch.refresh()
        return [self._watch.status(group) for group in range(len(self.task_endpoints))]

    async def first_beats(self) -> None:
        """Return once every group has beaten, or has not within its first-beat allowance: a
        client started beside its workers (`aioworker serve`) would otherwise find them all
        MISSING for the moment their first beats take to arrive, and refuse what came then."""
        while self._started and self._watch.awaiting_first_beat():
            await asyncio.sleep(FIRST_BEAT_POLL_S)

    def latest_heartbeats(self) -> list[Heartbeat | None]:
        """Each group's latest driver heartbeat (None before its first, or before start())."""
        if not self._started:
            return [None] * len(self.task_endpoints)
        return list(self._watch.beats)

    def takes_requests(self, state: str) -> bool:
        """Whether a group in `state` (from group_states) takes a new request: runs it (READY)
        or holds it until it can (paused, updating its weights, memory released and queuing)."""
        return takes_requests(state, self.while_released)

    # -- internals ----------------------------------------------------------------------------

    def _pick_group(self) -> int:
        if len(self.task_endpoints) == 1:
            return 0  # nothing to choose: skip reading the beats on every submission
        return pick_group(
            self.group_states(),
            self._watch.is_lost,
            self._in_flight,
            self.takes_requests,
            self._round_robin,
        )

    async def _read_results(self) -> None:
        # The same socket read without waiting: what has arrived is taken in one go, not one
        # awaited future per message.
        ready = zmq.Socket.shadow(self._results.underlying)
        while True:
            await asyncio.sleep(0)  # let the consumers run between results that arrive in bursts
            self._on_results(await self._results.recv_multipart())
            for _ in range(RESULTS_PER_WAKE - 1):
                try:
                    frames = ready.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on_results(frames)

    def _on_results(self, frames: list[bytes]) -> None:
        try:
            message = RESULT_DECODER.decode(frames)
        except ProtocolError as exc:
            log.warning("dropped a malformed result frame: %s", exc)
            return
        if not isinstance(message, Outputs):
            # Ends no stream: a frame that could not be decoded, or a duplicate request id.
            log.error("a worker rejected one of our frames: %s", message.reason)
            return
        for out in message.outputs:
            self._deliver(out)

    def _deliver(self, out: RequestOutput) -> None:
        queue = self._queues.get(out.request_id)
        if queue is None:
            self.num_unexpected_outputs += 1
            return
        queue.put_nowait(out)
        if out.finished and self._open[out.request_id].end(out):
            del self._queues[out.request_id]
            del self._open[out.request_id]
            owner = self._owner.pop(out.request_id)
            self._in_flight[owner] -= 1
            deadline = self._deadlines.pop(out.request_id, None)
            if deadline is not None:
                deadline.cancel()
