"""One HTTP request in the workers: its choices submitted together, read together (whole, or as
server-sent events), and aborted together when the client leaves or one of them fails."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec

from aioworker.api.choices import Choice
from aioworker.api.errors import ApiError, from_output
from aioworker.api.gateway import Gateway
from aioworker.api.guidance import Guidance
from aioworker.api.prompts import Prompt
from aioworker.api.shapes import ChatShape, CompletionShape
from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.request_stream import RequestStream

DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def is_failure(out: RequestOutput) -> bool:
    return out.finish_reason in (FinishReason.ERROR, FinishReason.ABORT)


class Run:
    def __init__(
        self,
        gateway: Gateway,
        shape: CompletionShape | ChatShape,
        prompts: list[Prompt],
        params: SamplingParams,
        arrived: float | None = None,
        guidance: Guidance | None = None,
    ) -> None:
        """`arrived`: time.perf_counter() when the HTTP request came (default: now).
        `guidance`: the constraint the client asked for, named in the workers' errors about it."""
        self.gateway = gateway
        self.guidance = guidance
        self.shape = shape
        self.started = time.perf_counter()
        self.clock = gateway.metrics.engine.clock(arrived or self.started)
        self.id = shape.id_prefix + gateway.next_id()
        self.created = int(time.time())
        self.prompts, self.params, self.n = prompts, params, params.n
        # Prompt p's sample i is choice p * n + i.
        self.choices = [
            Choice(p * self.n + i, prompt, gateway.tokenizer, params.stop)
            for p, prompt in enumerate(prompts)
            for i in range(self.n)
        ]
        self.num_prompt_tokens = sum(len(p.token_ids) for p in prompts)
        self.streams: list[RequestStream] = []  # one request (of n samples) per prompt
        # How the workers ended the request when they failed it (error or abort).
        self.failure: str | None = None

    async def submit(self) -> None:
        client, timeout_s = self.gateway.client, self.gateway.timeout_s
        try:
            for index, prompt in enumerate(self.prompts):
                request_id = f"{self.id}-{index}"
                stream = await client.submit(
                    prompt.token_ids, self.params, request_id, timeout_s=timeout_s
                )
                self.streams.append(stream)
        except BaseException:
            self.close()  # the prompts sent already would run for nobody
            raise
        metrics = self.gateway.metrics
        metrics.prompt_tokens.inc(self.num_prompt_tokens)
        metrics.engine.prompt_tokens.inc(self.num_prompt_tokens)

    def close(self) -> None:
        """Abort the choices still running (nobody will read them) and count what was made."""
        for index, stream in enumerate(self.streams):
            choices = self.choices[index * self.n : (index + 1) * self.n]
            if any(choice.finish_reason is None for choice in choices):
                self.gateway.client.abort_nowait(stream.request_id)
        generated = sum(c.num_tokens for c in self.choices)
        self.gateway.metrics.generation_tokens.inc(generated)
        # A choice that did not finish was failed by the workers, or left by its client.
        unfinished = self.failure or FinishReason.ABORT
        reasons = [c.finish_reason or unfinished for c in self.choices]
        self.clock.on_end(reasons, generated)

    # -- whole answers ------------------------------------------------------------------------

    async def collect(self) -> dict[str, Any]:
        """The whole answer; ApiError if any choice failed (the others are aborted)."""
        try:
            async for batch in self._outputs():
                for choice, out in batch:
                    if is_failure(out):
                        raise self._failed(out)
                    self._add(choice, out)
        finally:
            self.close()
        return {
            **self._header(self.shape.object_name),
            "choices": [self.shape.full_choice(c) for c in self.choices],
            "usage": self._usage(),
        }

    # -- streams ------------------------------------------------------------------------------

    async def events(
        self, include_usage: bool, continuous_usage: bool = False
    ) -> AsyncGenerator[bytes, None]:
        """Server-sent events. A failure before the first event raises ApiError (the answer is
        then an HTTP error); after it, it is sent as an error event. `continuous_usage`: every
        chunk carries the usage so far."""
        header = self._header(self.shape.chunk_object_name)
        opened: set[int] = set()
        try:
            async for batch in self._outputs():
                events = b""
                for choice, out in batch:
                    if is_failure(out):
                        error = self._failed(out)
                        if not opened:
                            raise error
                        yield events + b"data: " + error.body() + b"\n\n" + DONE
                        return
                    events += self._chunk(header, choice, out, opened, continuous_usage)
                if events:
                    yield events
            if include_usage:
                yield event({**header, "choices": [], "usage": self._usage()})
            yield DONE
        finally:
            self.close()

    def _chunk(
        self,
        header: dict[str, Any],
        choice: Choice,
        out: RequestOutput,
        opened: set[int],
        with_usage: bool,
    ) -> bytes:
        delta = self._add(choice, out)
        is_first = choice.index not in opened
        usage = {"usage": self._usage()} if with_usage else {}
        chunks = b""
        if is_first:
            if not opened:
                self.gateway.metrics.first_token.observe(time.perf_counter() - self.started)
            opened.add(choice.index)
            opening = self.shape.opening(choice)
            if opening is not None:
                chunks = event({**header, "choices": [opening], **usage})
        if delta or out.finished or out.logprobs or (is_first and self.shape.chunk_on_first):
            for body in self.shape.chunk_choices(choice, delta, out, is_first):
                chunks += event({**header, "choices": [body], **usage})
        return chunks

    # -- shared -------------------------------------------------------------------------------

    def _add(self, choice: Choice, out: RequestOutput) -> str:
        self.clock.on_output(choice.index, len(out.token_ids))
        return choice.add(out)

    def _failed(self, out: RequestOutput) -> ApiError:
        self.failure = out.finish_reason
        error = from_output(out, self.gateway.options.retry_after_s)
        return self.guidance.rename(error) if self.guidance is not None else error

    async def _outputs(self) -> AsyncIterator[list[tuple[Choice, RequestOutput]]]:
        """Every choice's outputs as they come, until each has ended: each batch holds what had
        arrived by the time the last was taken, so a reader that falls behind catches up in one
        write instead of one per output."""
        if len(self.streams) == 1:
            stream = self.streams[0]
            async for out in stream:
                yield [(self._choice(0, o), o) for o in (out, *stream.ready())]
            return
        merged: asyncio.Queue[tuple[Choice, RequestOutput] | None] = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            async for out in stream:
                merged.put_nowait((self._choice(index, out), out))
            merged.put_nowait(None)  # this prompt's request has ended

        pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        num_open = len(pumps)
        try:
            while num_open:
                batch = [await merged.get()]
                while not merged.empty():
                    batch.append(merged.get_nowait())
                num_open -= batch.count(None)
                yield [item for item in batch if item is not None]
        finally:
            for task in pumps:
                task.cancel()

    def _choice(self, prompt_index: int, out: RequestOutput) -> Choice:
        return self.choices[prompt_index * self.n + out.sample_index]

    def _header(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.gateway.model_name,
        }

    def _usage(self) -> dict[str, Any]:
        generated = sum(c.num_tokens for c in self.choices)
        usage: dict[str, Any] = {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": self.num_prompt_tokens + generated,
        }
        drafts = sum(c.num_draft_tokens for c in self.choices)
        if drafts:
            # OpenAI's fields for predicted outputs: speculative drafts are predictions too.
            accepted = sum(c.num_accepted_tokens for c in self.choices)
            usage["completion_tokens_details"] = {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": drafts - accepted,
            }
        return usage
