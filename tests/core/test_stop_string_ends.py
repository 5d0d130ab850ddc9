"""Stop strings end a request at the token that completes them, even where one step gives
several tokens (verified drafts)."""

from __future__ import annotations

from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.stop_string_ends import StopStringEnds


class Letters:
    """A tokenizer whose token i is the i-th letter."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t) for t in token_ids)


def test_a_step_of_several_tokens_is_cut_after_the_one_completing_the_stop_string() -> None:
    ends = StopStringEnds(Letters())
    ends.add("r", 0, ("cd",))
    stopped = []
    # "a b c d e": the stop string completes at the fourth token; the fifth is not the request's.
    out = RequestOutput("r", [0, 1, 2, 3, 4], logprobs=[None] * 5)
    [got] = ends.apply([out], lambda *key: stopped.append(key))
    assert got.token_ids == [0, 1, 2, 3] and len(got.logprobs) == 4
    assert got.finish_reason is FinishReason.STOP and got.stop_string == "cd"
    assert stopped == [("r", 0)]


def test_tokens_without_a_stop_string_pass_whole() -> None:
    ends = StopStringEnds(Letters())
    ends.add("r", 0, ("zz",))
    [got] = ends.apply([RequestOutput("r", [0, 1, 2])], lambda *key: None)
    assert got.token_ids == [0, 1, 2] and got.finish_reason is None
