"""Stop strings in the engine core: requests that gave some are detokenized as their tokens
arrive, and end with "stop" in the step whose token completes one, so no further step is spent
on them."""

from __future__ import annotations

import msgspec

from aioworker.core.detokenizer import Decodes
from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.sampling_params import InvalidRequestError
from aioworker.core.text_stream import TextStream


class TextStops:
    def __init__(self, tokenizer: Decodes | None) -> None:
        self.tokenizer = tokenizer
        self._streams: dict[str, TextStream] = {}

    def __bool__(self) -> bool:
        return bool(self._streams)

    def check(self, stop: tuple[str, ...]) -> None:
        if stop and self.tokenizer is None:
            raise InvalidRequestError(
                "stop strings need the model's tokenizer (tokenizer.json in the model "
                "directory); give stop_token_ids instead"
            )

    def add(self, request_id: str, stop: tuple[str, ...]) -> None:
        if stop:
            self._streams[request_id] = TextStream(self.tokenizer, stop)

    def discard(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def apply(self, outputs: list[RequestOutput], stop_request) -> list[RequestOutput]:
        """Outputs with those whose text completed a stop string made terminal ("stop", and
        the stop string); `stop_request(request_id)` ends such a request in the scheduler."""
        for index, out in enumerate(outputs):
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.add(out.token_ids)
            if stream.matched is not None:
                if not out.finished:
                    stop_request(out.request_id)
                outputs[index] = msgspec.structs.replace(
                    out, finish_reason=FinishReason.STOP, stop_string=stream.matched
                )
            if outputs[index].finished:
                del self._streams[out.request_id]
        return outputs
