"""The xgrammar backend against the embedded model's tokenizer: each kind compiles to what it
asks for, bad ones fail naming the kind, and compiled grammars are kept by content within a
byte budget."""

from __future__ import annotations

import numpy as np
import pytest

from aioworker.compute.grammar.xgrammar_backend import XgrammarBackend
from aioworker.config import GuidedOptions
from aioworker.core.guided import GuidedParams
from aioworker.core.request_errors import InvalidRequestError

VOCAB = 49152
EOS = 2
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def backend(embedded_model_dir) -> XgrammarBackend:
    backend = XgrammarBackend(embedded_model_dir / "tokenizer.json", VOCAB, (EOS,))
    yield backend
    backend.close()


def matches(backend: XgrammarBackend, guided: GuidedParams, text: str) -> bool:
    """Whether `text` is a whole output the grammar accepts (it may end there)."""
    matcher = backend.matcher(backend.compile(guided).result(), [EOS])
    if not matcher.accept_string(text):
        return False
    return matcher.accept_token(EOS) and matcher.is_terminated()


@pytest.mark.parametrize(
    ("guided", "good", "bad"),
    [
        (GuidedParams(json_schema=SCHEMA), '{"name": "Ann", "age": 3}', '{"name": "Ann"}'),
        (GuidedParams(json_object=True), '{"a": [1, 2]}', "[1, 2]"),
        (GuidedParams(regex=r"\d{4}-\d{2}-\d{2}"), "2026-12-02", "2026-1-02"),
        (GuidedParams(grammar='root ::= "a" root | "b"'), "aaab", "aaa"),
        (GuidedParams(choice=("yes", 'say "no"')), 'say "no"', "maybe"),
    ],
)
def test_each_kind_accepts_what_it_asks_for_and_nothing_else(
    backend: XgrammarBackend, guided: GuidedParams, good: str, bad: str
) -> None:
    assert matches(backend, guided, good)
    assert not matches(backend, guided, bad)


def test_compact_json_allows_no_optional_whitespace(backend: XgrammarBackend) -> None:
    compact = GuidedParams(json_schema=SCHEMA, compact_json=True)
    assert matches(backend, compact, '{"name":"Ann","age":3}')
    assert not matches(backend, compact, '{"name": "Ann", "age": 3}')


@pytest.mark.parametrize(
    ("guided", "named"),
    [
        (GuidedParams(regex="(ab"), "guided.regex does not compile: "),
        (GuidedParams(grammar="root ::= missing"), 'Rule "missing" is not defined'),
        (GuidedParams(json_schema={"type": "wat"}), "guided.json_schema does not compile: "),
    ],
)
def test_a_bad_grammar_fails_naming_its_kind_and_the_fault(
    backend: XgrammarBackend, guided: GuidedParams, named: str
) -> None:
    with pytest.raises(InvalidRequestError, match="does not compile") as caught:
        backend.compile(guided).result()
    assert named in str(caught.value) and "/project/" not in str(caught.value)


def test_the_same_request_compiles_once(backend: XgrammarBackend) -> None:
    first = backend.compile(GuidedParams(regex="[a-c]+x"))
    first.result()
    hits = backend.num_cache_hits
    assert backend.compile(GuidedParams(regex="[a-c]+x")) is first
    assert backend.num_cache_hits == hits + 1


def test_the_cache_keeps_its_byte_budget_dropping_the_least_recently_used(
    embedded_model_dir,
) -> None:
    small = XgrammarBackend(
        embedded_model_dir / "tokenizer.json", VOCAB, (EOS,), GuidedOptions(cache_bytes=1)
    )
    try:
        first = small.compile(GuidedParams(regex="a+"))
        first.result()
        small.compile(GuidedParams(regex="b+")).result()
        assert small.compile(GuidedParams(regex="a+")) is not first  # dropped, compiled again
    finally:
        small.close()


def test_a_matcher_fills_its_row_with_its_allowed_tokens(backend: XgrammarBackend) -> None:
    compiled = backend.compile(GuidedParams(choice=("yes", "no"))).result()
    matchers = [backend.matcher(compiled, [EOS]) for _ in range(2)]
    matchers[1].accept_string("yes")
    bitmask = np.zeros((2, backend.num_mask_words), np.int32)
    for row, matcher in enumerate(matchers):
        matcher.fill_next_token_bitmask(bitmask, row)
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    assert allowed[0].sum() > 1 and allowed[0, EOS] == 0
    assert np.flatnonzero(allowed[1]).tolist() == [EOS]  # "yes" is whole: only the end


def test_a_vocabulary_read_up_front_is_not_read_again_by_the_first_compile(
    embedded_model_dir, monkeypatch
) -> None:
    """A serving rank reads it while loading: read on a first request, it held the GIL long
    enough to pause every stream and the rank's heartbeat."""
    from aioworker.compute.grammar import xgrammar_backend

    fresh = XgrammarBackend(embedded_model_dir / "tokenizer.json", VOCAB, (EOS,))
    try:
        fresh.read_vocabulary()

        def read_again(*args):
            raise AssertionError("the first compile read the vocabulary")

        monkeypatch.setattr(xgrammar_backend, "tokenizer_info", read_again)
        guided = GuidedParams(json_schema=SCHEMA)
        assert fresh.matcher(fresh.compile(guided).result(), [EOS]).accept_string('{"name"')
    finally:
        fresh.close()
