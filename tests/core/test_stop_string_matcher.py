"""The stop-string matcher: matches across deltas, holds back only what could still complete a
stop string, and never shows the stop string or anything after it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aioworker.core.stop_string_matcher import StopStringMatcher


def run(stop: list[str], deltas: list[str]) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stop)
    shown = "".join(matcher.feed(d) for d in deltas) + matcher.flush()
    return shown, matcher.matched


def test_a_stop_string_split_across_deltas_is_found_and_cut() -> None:
    assert run(["END"], ["Hello E", "N", "D and more"]) == ("Hello ", "END")


def test_text_is_held_only_while_it_could_complete_a_stop_string() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abc ST") == "abc "  # "ST" may start STOP
    assert matcher.feed("x") == "STx"  # it did not
    assert matcher.feed("S") == ""
    assert matcher.flush() == "S"  # the request ended: what was held is text after all
    assert matcher.matched is None


def test_the_stop_that_completes_first_wins_and_nothing_follows() -> None:
    matcher = StopStringMatcher(["world", "lo"])
    assert matcher.feed("hello world") == "hel"
    assert matcher.matched == "lo"
    assert matcher.feed("more") == "" and matcher.flush() == ""
    # "abc" starts first, but "b" is complete first: the worker, seeing "ab", stops there.
    assert run(["abc", "b"], ["abc"]) == ("a", "b")


def test_no_stop_strings_passes_text_through() -> None:
    assert run([], ["a", "b"]) == ("ab", None)


@given(
    text=st.text(alphabet="abc", max_size=40),
    stop=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_any_split_shows_the_text_before_the_first_completed_stop(text, stop, cuts) -> None:
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    shown, matched = run(stop, deltas)
    ends = [end for end in range(1, len(text) + 1) if any(text[:end].endswith(s) for s in stop)]
    if not ends:
        assert (shown, matched) == (text, None)
    else:
        longest = max((s for s in stop if text[: ends[0]].endswith(s)), key=len)
        assert (shown, matched) == (text[: ends[0] - len(longest)], longest)
