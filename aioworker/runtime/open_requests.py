"""The requests a driver has admitted and not yet ended: where each one's outputs go, and its
terminal outputs. Every request gets exactly one per sample (one, unless it asked for `n`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from aioworker.core.engine_core import EngineCore
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput
from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.metrics import WorkerMetrics
from aioworker.runtime.results import ClientAddress, ResultSender
from aioworker.wire.protocol import Outputs


@dataclass(slots=True)
class Request:
    client: ClientAddress
    arrival: float  # time.monotonic() at admission
    first_token_at: float | None = None
    deadline: asyncio.TimerHandle | None = None  # aborts the request when its time is up
    # Samples without their terminal output yet.
    open_samples: set[int] | None = None


class OpenRequests:
    def __init__(
        self,
        core: EngineCore,
        results: ResultSender,
        group: int,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.core = core
        self.results = results
        self.group = group
        self.metrics = metrics
        self._requests: dict[str, Request] = {}
        # Called when an abort leaves no request open (the driver finishes a drain on it).
        self.on_all_ended: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def client_of(self, request_id: str) -> ClientAddress | None:
        request = self._requests.get(request_id)
        return request.client if request is not None else None

    def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        client: ClientAddress,
    ) -> None:
        """Hand the request to the engine core; raises InvalidRequestError naming a bad field."""
        self.core.add(request_id, prompt_token_ids, params)
        self._requests[request_id] = Request(
            client, time.monotonic(), open_samples=set(range(params.n))
        )
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(prompt_token_ids))

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """One Outputs message per client for this step (runs per sequence: kept lean)."""
        by_client: dict[ClientAddress, list[RequestOutput]] = {}
        find = self._requests.get
        for out in outputs:
            request = find(out.request_id)
            if request is None:
                continue
            batch = by_client.get(request.client)
            if batch is None:
                by_client[request.client] = [out]
            else:
                batch.append(out)
            if request.first_token_at is None:
                self._on_first_token(request)
            if out.finish_reason is not None:
                request.open_samples.discard(out.sample_index)
                if not request.open_samples:
                    self._on_finished(out.request_id, out.finish_reason)
        for (reply_to, client_key), batch in by_client.items():
            self.results.send(reply_to, Outputs(group=self.group, outputs=batch), client_key)

    def abort(self, request_id: str, reason: str) -> bool:
        """End a request with "abort" and `reason`; False if it is not open."""
        if not self._abort(request_id, reason):
            return False
        if not self._requests:
            self.on_all_ended()
        return True

    def abort_client(self, client: ClientAddress, reason: str) -> int:
        """End every open request of one client (it vanished or stopped reading)."""
        request_ids = [rid for rid, request in self._requests.items() if request.client == client]
        return self._abort_each(request_ids, reason)

    def abort_all(self, reason: str) -> int:
        return self._abort_each(list(self._requests), reason)

    def set_timeout(self, request_id: str, timeout_s: float) -> None:
        """Abort the request `timeout_s` from now if it is still open."""
        reason = f"timed out: its deadline of {timeout_s:g}s passed"
        timer = asyncio.get_running_loop().call_later(timeout_s, self.abort, request_id, reason)
        self._requests[request_id].deadline = timer

    def _abort_each(self, request_ids: list[str], reason: str) -> int:
        for request_id in request_ids:
            self._abort(request_id, reason)
        if not self._requests:
            self.on_all_ended()
        return len(request_ids)

    def _abort(self, request_id: str, reason: str) -> bool:
        request = self._requests.get(request_id)
        if request is None:
            return False
        self._on_finished(request_id, FinishReason.ABORT)
        self.core.abort(request_id)
        for index in sorted(request.open_samples):
            self.send_terminal(request.client, request_id, FinishReason.ABORT, reason, None, index)
        return True

    def fail_all(self, reason: str) -> None:
        """The rank is failing: every open request ends with "error" and the reason."""
        for request_id, request in self._requests.items():
            for index in sorted(request.open_samples):
                self.send_terminal(
                    request.client,
                    request_id,
                    FinishReason.ERROR,
                    reason,
                    ErrorKind.UNAVAILABLE,
                    index,
                )
        self._requests.clear()

    def send_terminal(
        self,
        client: ClientAddress,
        request_id: str,
        reason: FinishReason,
        message: str,
        error_kind: ErrorKind | None = None,
        sample_index: int = 0,
    ) -> None:
        """A terminal output outside a step: refused at admission, aborted, failed."""
        output = self.core.terminal_output(request_id, reason, message, error_kind, sample_index)
        reply_to, client_key = client
        self.results.send(reply_to, Outputs(group=self.group, outputs=[output]), client_key)

    def _on_first_token(self, request: Request) -> None:
        request.first_token_at = time.monotonic()
        if self.metrics is not None:
            self.metrics.ttft.observe(request.first_token_at - request.arrival)

    def _on_finished(self, request_id: str, reason: FinishReason) -> None:
        request = self._requests.pop(request_id)
        if request.deadline is not None:
            request.deadline.cancel()
        if self.metrics is not None:
            self.metrics.on_finished(request.arrival, reason)
