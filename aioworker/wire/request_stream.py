"""One request's outputs on the client's side, as they arrive: a stream of all its samples that
ends after the last of them has ended. Torch-free."""

from __future__ import annotations

import asyncio

from aioworker.core.outputs import FinishReason, RequestOutput


class OpenSamples:
    """How many of a request's samples have not ended: each ends with its terminal output, and
    an error ends them all (a refusal at admission, a lost group, a missed deadline)."""

    __slots__ = ("num_open",)

    def __init__(self, n: int) -> None:
        self.num_open = n

    def end(self, out: RequestOutput) -> bool:
        """Count `out`; whether the request has ended with it."""
        if out.finish_reason is not None:
            self.num_open = 0 if out.finish_reason == FinishReason.ERROR else self.num_open - 1
        return self.num_open == 0


class RequestStream:
    """One request's outputs as they arrive (of all its samples, told apart by `sample_index`),
    ending after its last terminal output; `group` is the data-parallel group serving it."""

    def __init__(
        self, request_id: str, group: int, queue: asyncio.Queue[RequestOutput], n: int = 1
    ) -> None:
        self.request_id = request_id
        self.group = group
        self._queue = queue
        self._open = OpenSamples(n)
        self._ended = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._ended:
            raise StopAsyncIteration
        out = await self._queue.get()
        self._ended = self._open.end(out)
        return out

    def ready(self) -> list[RequestOutput]:
        """The outputs that have arrived already, without waiting (a consumer that fell behind
        takes them at once and writes them together)."""
        outs = []
        while not self._ended and not self._queue.empty():
            out = self._queue.get_nowait()
            self._ended = self._open.end(out)
            outs.append(out)
        return outs
