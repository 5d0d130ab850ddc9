"""Where the engine core ends requests at their stop strings: an OutputText per sample of each
request that gave some, fed the outputs of every step, so a sample ends with "stop" in the step
whose token completes one and no further step is spent on it."""

from __future__ import annotations

import msgspec

from aioworker.core.detokenizer import Decodes
from aioworker.core.output_text import OutputText
from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.sampling_params import InvalidRequestError


class StopStringEnds:
    def __init__(self, tokenizer: Decodes | None) -> None:
        self.tokenizer = tokenizer
        # By request id and sample index.
        self._streams: dict[tuple[str, int], OutputText] = {}

    def __bool__(self) -> bool:
        return bool(self._streams)

    def check(self, stop: tuple[str, ...]) -> None:
        if stop and self.tokenizer is None:
            raise InvalidRequestError(
                "stop strings need the model's tokenizer (tokenizer.json in the model "
                "directory); give stop_token_ids instead"
            )

    def add(self, request_id: str, sample_index: int, stop: tuple[str, ...]) -> None:
        if stop:
            self._streams[(request_id, sample_index)] = OutputText(self.tokenizer, stop)

    def discard(self, request_id: str) -> None:
        """Every sample of the request."""
        for key in [key for key in self._streams if key[0] == request_id]:
            del self._streams[key]

    def apply(self, outputs: list[RequestOutput], stop_request) -> list[RequestOutput]:
        """Outputs with those whose text completed a stop string made terminal ("stop", and
        the stop string); `stop_request(request_id, sample_index)` ends such a sample in the
        scheduler."""
        for index, out in enumerate(outputs):
            key = (out.request_id, out.sample_index)
            stream = self._streams.get(key)
            if stream is None:
                continue
            kept = _add_until_matched(stream, out.token_ids)
            if stream.matched is not None:
                if not out.finished:
                    stop_request(*key)
                outputs[index] = msgspec.structs.replace(
                    out,
                    token_ids=out.token_ids[:kept],
                    logprobs=None if out.logprobs is None else out.logprobs[:kept],
                    finish_reason=FinishReason.STOP,
                    stop_string=stream.matched,
                )
            if outputs[index].finished:
                del self._streams[key]
        return outputs


def _add_until_matched(stream: OutputText, token_ids: list[int]) -> int:
    """Feed the tokens one by one until one completes a stop string; returns how many were
    fed. A step that verified drafts gives several tokens, and those after the one that
    completes a stop string are not the request's."""
    if len(token_ids) == 1:
        stream.add(token_ids)
        return 1
    for count, token_id in enumerate(token_ids, 1):
        stream.add([token_id])
        if stream.matched is not None:
            return count
    return len(token_ids)
