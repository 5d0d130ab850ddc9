"""The routes against a live in-process server and fake-executor group: huge prompts never hold
the server up, refusals come before any cost and leave nothing registered, errors name their
field, the sampling controls and usage options reach the answer, and the tokenize and model
routes answer as vLLM's do."""

from __future__ import annotations

import json
import threading
import time

import pytest

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.fake_executor import fake_token
from tests.api.inprocess import MODEL, ServedGateway
from tests.api.service import request

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir) -> Tokenizer:
    return Tokenizer(embedded_model_dir)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    with ServedGateway(tmp_path_factory.mktemp("app"), tokenizer) as served:
        yield served


def post(served, path: str, body: dict) -> tuple[int, dict]:
    status, _, raw = request(served.url, "POST", path, body)
    return status, json.loads(raw)


def in_flight(served) -> int:
    return served.call(lambda: served.gateway.client.num_in_flight)


def test_health_answers_at_once_while_a_huge_prompt_is_tokenized(tmp_path, tokenizer) -> None:
    # Under the character cap of a 100,000-token context, over its tokens: a second or more of
    # tokenizing before the refusal.
    body = {"model": MODEL, "prompt": "hello world, this is a test. " * 70_000, "max_tokens": 1}
    answer: list = []
    with ServedGateway(tmp_path, tokenizer, {"model.max_model_len": 100_000}) as served:
        started = time.monotonic()
        sender = threading.Thread(
            target=lambda: answer.append((post(served, "/v1/completions", body), time.monotonic()))
        )
        sender.start()
        waits = []
        while sender.is_alive():
            asked = time.monotonic()
            assert request(served.url, "GET", "/health")[0] == 200
            waits.append(time.monotonic() - asked)
        sender.join()
    (status, error), answered = answer[0]
    assert status == 400 and "max_model_len is 100000" in error["error"]["message"]
    # Tokenizing on the event loop would hold /health for all of it: one answer, as slow as the
    # refusal. Off the loop, many answers, each a small part of it (on a loaded machine too).
    took = answered - started
    assert len(waits) >= 5 and max(waits) < took / 4, (took, sorted(waits)[-3:], len(waits))


def test_a_prompt_longer_than_max_model_len_is_refused_naming_both_lengths(served) -> None:
    status, body = post(served, "/v1/completions", {"model": MODEL, "prompt": [7] * 300})
    assert (
        status == 400 and body["error"]["message"] == "prompt has 300 tokens; max_model_len is 256"
    )
    assert body["error"]["param"] == "prompt"
    long_chat = [*MESSAGES, {"role": "user", "content": "Hello " * 400}]
    status, body = post(served, "/v1/chat/completions", {"model": MODEL, "messages": long_chat})
    assert status == 400 and body["error"]["param"] == "messages"
    assert "max_model_len is 256" in body["error"]["message"]


def test_a_text_over_the_character_cap_is_refused_without_tokenizing(served) -> None:
    calls = []
    tokenizer = served.gateway.tokenizer
    encode = tokenizer.encode_unlocked
    tokenizer.encode_unlocked = lambda *args: calls.append(1) or encode(*args)
    try:
        text = "x" * (256 * served.gateway.tokens.chars_per_token + 1)
        status, body = post(served, "/v1/completions", {"model": MODEL, "prompt": text})
    finally:
        del tokenizer.encode_unlocked
    assert status == 400 and body["error"]["param"] == "prompt" and calls == []
    assert f"has {len(text)} characters" in body["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 2**64}, "max_tokens"),
        ({"prompt": [1, 2**64]}, "prompt"),
        ({"prompt": [[1], [2**70]]}, "prompt[1]"),
        ({"logit_bias": {str(2**64): 1}}, "logit_bias"),
    ],
)
def test_integers_too_big_for_the_wire_are_400_and_leave_nothing_registered(served, fields, param):
    status, body = post(served, "/v1/completions", {"model": MODEL, "prompt": "Hi", **fields})
    assert status == 400 and body["error"]["param"] == param, body
    assert in_flight(served) == 0


def test_a_body_nested_100000_deep_is_a_400(served) -> None:
    import http.client

    raw = b'{"model": "embedded", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("POST", "/v1/completions", raw, {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400 and b"nests" in response.read()
    assert in_flight(served) == 0


def test_top_logprobs_25_names_top_logprobs(served) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "logprobs": True, "top_logprobs": 25}
    status, answer = post(served, "/v1/chat/completions", body)
    assert status == 400 and answer["error"]["param"] == "top_logprobs"
    bad = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]}
    status, answer = post(served, "/v1/chat/completions", bad)
    assert status == 400 and answer["error"]["param"] == "messages[0].content[0].type"


def test_the_sampling_controls_users_send_are_served(served) -> None:
    body = {
        "model": "alias",  # any served name is accepted; answers carry the first
        "prompt": "Once upon a time",
        "max_tokens": 5,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "min_p": 0.01,
        "logit_bias": {"5": 1.5},
        "allowed_token_ids": list(range(1, 3000)),
        "bad_words": ["dragon"],
        "seed": -1,
    }
    status, answer = post(served, "/v1/completions", body)
    assert status == 200, answer
    assert answer["model"] == MODEL and answer["usage"]["completion_tokens"] == 5


def test_speculative_drafts_are_counted_in_the_usage(tmp_path, tokenizer) -> None:
    """The prompt holds the fake model's next tokens, so n-gram drafts copied from it are
    verified and accepted; a prompt without them gets no drafts."""
    speculative = {
        "speculative.method": "ngram",
        "speculative.dynamic": False,
        "speculative.ngram_min": 1,
    }
    prompt = [fake_token(8 + i) for i in range(8)]  # what positions 8.. will sample
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6}
    with ServedGateway(tmp_path, tokenizer, speculative) as served:
        status, answer = post(served, "/v1/completions", body)
        plain_status, plain = post(served, "/v1/completions", {**body, "prompt": [5, 6, 7]})
    assert status == 200 and plain_status == 200, answer
    assert answer["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": 4,  # after the first token, one step of four drafts
        "rejected_prediction_tokens": 0,
    }
    assert answer["usage"]["completion_tokens"] == 6
    assert "completion_tokens_details" not in plain["usage"]  # nothing was predicted


def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(served) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    _, _, raw = request(served.url, "POST", "/v1/completions", body)
    chunks = [json.loads(line[6:]) for line in raw.decode().splitlines() if line[6:7] == "{"]
    prompt_tokens = len(served.gateway.tokenizer.encode("Once upon a time"))
    generated = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    assert generated == sorted(generated) and generated[-1] == 4 and len(chunks) >= 4


def test_tokenize_and_detokenize_answer_as_vllm_does(served, tokenizer) -> None:
    status, answer = post(served, "/tokenize", {"model": MODEL, "prompt": "Hello there"})
    ids = tokenizer.encode("Hello there")
    assert status == 200 and answer == {
        "count": len(ids),
        "max_model_len": 256,
        "tokens": ids,
        "token_strs": None,
    }
    no_special = post(served, "/tokenize", {"prompt": "Hi", "add_special_tokens": False})[1]
    assert no_special["tokens"] == tokenizer.encode("Hi", add_special_tokens=False)
    chat = post(served, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})[1]
    template = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False)
    assert chat["tokens"] == tokenizer.encode(template, add_special_tokens=False)
    assert post(served, "/detokenize", {"tokens": ids}) == (200, {"prompt": "Hello there"})
    status, error = post(served, "/detokenize", {"tokens": [2**40]})
    assert status == 400 and error["error"]["param"] == "tokens"
    assert post(served, "/tokenize", {"prompt": "x", "model": "gpt-4"})[0] == 404


def test_models_name_the_root_and_max_model_len(served) -> None:
    status, _, raw = request(served.url, "GET", "/v1/models")
    cards = json.loads(raw)["data"]
    assert status == 200 and [c["id"] for c in cards] == [MODEL, "alias"]
    assert all(c["root"] == MODEL and c["max_model_len"] == 256 for c in cards)


def test_a_group_that_cannot_serve_is_refused_before_tokenizing(tmp_path, tokenizer) -> None:
    calls = []
    encode = tokenizer.encode_unlocked
    tokenizer.encode_unlocked = lambda *args: calls.append(1) or encode(*args)
    try:
        with ServedGateway(tmp_path, tokenizer, with_group=False) as served:
            body = {"model": MODEL, "prompt": "Hello " * 100}
            status, answer = post(served, "/v1/completions", body)
    finally:
        del tokenizer.encode_unlocked
    assert status == 503 and "group 0 MISSING" in answer["error"]["message"]
    assert calls == []
