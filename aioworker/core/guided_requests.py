"""Requests whose grammar is still compiling. They wait here, outside the scheduler, so they hold
no running slot and no KV block, and the requests behind them are not held up; once compiled,
each of their samples gets a matcher of its own and they join the queue. A grammar that fails to
compile ends its request with an invalid-request error naming what is wrong. Torch-free."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from concurrent.futures import Future

from aioworker.core.grammar import GrammarBackend, SequenceGrammar
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput
from aioworker.core.request_errors import InvalidRequestError
from aioworker.core.sequence import Sequence

# How long the offline engine waits for a compile before looking again.
_WAIT_S = 1.0


class GuidedRequests:
    def __init__(self, backend: GrammarBackend | None, eos_token_ids: tuple[int, ...]) -> None:
        self.backend = backend
        self.eos_token_ids = eos_token_ids
        self._compiling: dict[str, tuple[list[Sequence], Future]] = {}
        self._refused: list[tuple[str, int, str]] = []  # request id, samples, why
        self.num_refused = 0  # requests whose grammar failed to compile, since start
        # Called (on a compile thread) when a grammar is ready: the driver wakes its step loop.
        self.on_ready: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self._compiling) + len(self._refused)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._compiling

    def start(self, samples: list[Sequence]) -> bool:
        """Begin compiling a request's grammar: True if it is ready now (a cached grammar: its
        samples have their matchers), False if it compiles meanwhile. Raises
        InvalidRequestError when the rank cannot guide, or the grammar is known to be bad."""
        if self.backend is None:
            raise InvalidRequestError(
                "guided decoding needs the model's tokenizer, and this rank has none: serve a "
                "model directory with tokenizer.json"
            )
        future = self.backend.compile(samples[0].params.guided)
        if future.done():
            self._attach(samples, future.result())
            return True
        self._compiling[samples[0].request_id] = (samples, future)
        future.add_done_callback(lambda _: self.on_ready())
        return False

    def take_compiled(self) -> list[list[Sequence]]:
        """The samples of each request whose grammar compiled since the last call; the ones
        that failed are kept for `take_refused`."""
        ready = []
        for request_id, (samples, future) in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[request_id]
            try:
                self._attach(samples, future.result())
            except Exception as exc:
                self._refused.append((request_id, len(samples), _reason(exc)))
                self.num_refused += 1
            else:
                ready.append(samples)
        return ready

    def take_refused(self, terminal: Callable[..., RequestOutput]) -> list[RequestOutput]:
        """One error output per sample of each request whose grammar failed."""
        outputs = [
            terminal(request_id, FinishReason.ERROR, why, ErrorKind.INVALID, index)
            for request_id, num_samples, why in self._refused
            for index in range(num_samples)
        ]
        self._refused = []
        return outputs

    @property
    def num_compiling(self) -> int:
        return len(self._compiling)

    def drop(self, request_id: str) -> bool:
        """Forget a compiling request (aborted); False if it is not compiling."""
        return self._compiling.pop(request_id, None) is not None

    def wait_for_one(self) -> None:
        """Block until a compile finishes (the offline engine, with nothing else to run)."""
        futures = [future for _, future in self._compiling.values()]
        if futures:
            concurrent.futures.wait(futures, _WAIT_S, concurrent.futures.FIRST_COMPLETED)

    def _attach(self, samples: list[Sequence], compiled: object) -> None:
        for seq in samples:
            stop_token_ids = sorted(seq.stop_token_ids | frozenset(self.eos_token_ids))
            seq.grammar = SequenceGrammar(self.backend.matcher(compiled, stop_token_ids))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, InvalidRequestError):
        return str(exc)
    return f"guided: the grammar could not be compiled: {type(exc).__name__}: {exc}"
