"""The official `openai` package against a live `aioworker serve --api-port` on the embedded
model: completions and chat, whole and streamed, n, seed, stop, logprobs, errors, and a client
that leaves mid-stream."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request

import openai
import pytest

from aioworker.cli.main import main
from tests.api.service import open_stream, request
from tests.workers import admin

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
GREEDY = {"model": "embedded", "temperature": 0, "max_tokens": 12}


def streamed_text(chunks, field: str) -> tuple[str, list]:
    text, finishes = "", []
    for chunk in chunks:
        for choice in chunk.choices:
            text += (choice.text if field == "text" else choice.delta.content) or ""
            finishes.append(choice.finish_reason)
    return text, finishes


def test_completions_whole_and_streamed_agree(live) -> None:
    client = live.openai()
    whole = client.completions.create(prompt=PROMPT, **GREEDY)
    assert whole.choices[0].text.strip()
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens > 0
    chunks = list(
        client.completions.create(
            prompt=PROMPT, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text, finishes = streamed_text(chunks, "text")
    assert text == whole.choices[0].text
    assert finishes[-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_whole_and_streamed_agree(live) -> None:
    client = live.openai()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(messages=messages, **GREEDY)
    content = whole.choices[0].message.content
    assert "Paris" in content
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text, finishes = streamed_text(chunks, "chat")
    assert text == content and finishes[-1] == whole.choices[0].finish_reason


def test_greedy_text_equals_aioworker_generate(live, capsys) -> None:
    text = live.openai().completions.create(prompt=PROMPT, **GREEDY).choices[0].text
    argv = ["generate", "--connect", "--prompt", PROMPT, "--max-tokens", "12"]
    assert main([*argv, "--temperature", "0", "--json", *live.set_args]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["text"] == text


def test_n_choices_follow_their_seeds(live) -> None:
    client = live.openai()
    sampled = {"model": "embedded", "max_tokens": 10, "temperature": 1.0, "prompt": PROMPT}
    three = client.completions.create(n=3, seed=7, logprobs=0, **sampled)
    texts = [c.text for c in sorted(three.choices, key=lambda c: c.index)]
    assert len(texts) == 3 and len(set(texts)) > 1
    assert three.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in three.choices)
    assert (
        three.usage.prompt_tokens
        == client.completions.create(prompt=PROMPT, **GREEDY).usage.prompt_tokens
    )  # the prompt counts once, not n times
    singles = [client.completions.create(seed=7 + i, **sampled).choices[0].text for i in range(3)]
    assert singles == texts


def test_a_stop_string_ends_the_text_before_it(live) -> None:
    client = live.openai()
    full = client.completions.create(prompt=PROMPT, **GREEDY).choices[0].text
    words = re.findall(r"\w{3,}", full)
    stop = words[1] if len(words) > 1 else words[0]
    cut = client.completions.create(prompt=PROMPT, stop=[stop], **GREEDY)
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs_with_top_5(live) -> None:
    client = live.openai()
    out = client.completions.create(prompt=PROMPT, logprobs=5, echo=True, **GREEDY).choices[0]
    lp = out.logprobs
    assert lp.token_logprobs[0] is None  # the first prompt token has nothing before it
    rows = list(zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True))
    for _token, value, top in rows:
        assert value <= 0 and len(top) == 5 and max(top.values()) >= value - 1e-6
    for token, value, top in rows[-12:]:  # greedy: each generated token is the likeliest
        assert math.isclose(top[token], value, abs_tol=1e-6) and value >= max(top.values()) - 1e-6
    assert "".join(lp.tokens) == out.text  # echo: prompt and completion, token by token
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": "Say hi"}], logprobs=True, top_logprobs=5, **GREEDY
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 5
        # Greedy: the sampled token is the likeliest.
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-6)


def test_an_unsupported_field_is_refused_by_name(live) -> None:
    status, _, body = request(
        live.url, "POST", "/v1/completions", {"prompt": PROMPT, "model": "embedded", "foo": 1}
    )
    assert status == 400 and b'"param":"foo"' in body
    with pytest.raises(openai.BadRequestError, match="suffix"):
        live.openai().completions.create(prompt=PROMPT, suffix="end", **GREEDY)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        live.openai().completions.create(prompt=PROMPT, model="gpt-4", max_tokens=3)


def test_a_client_that_leaves_mid_stream_aborts_its_request(live) -> None:
    body = {
        "model": "embedded",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    sock, received = open_stream(live.url, "/v1/chat/completions", body)
    assert b"200 OK" in received.split(b"\r\n", 1)[0]
    sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        status = admin(live.config, "status").data
        if status["num_requests"] == 0 and status["kv_blocks_used"] == 0:
            break
        time.sleep(0.05)
    assert status["num_requests"] == 0 and status["kv_blocks_used"] == 0, status
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{live.worker_metrics_port}/metrics")
    aborted = re.search(
        rb'request_success_total\{finished_reason="abort",group="0"\} (\S+)', metrics.read()
    )
    assert aborted and float(aborted[1]) >= 1
    gateway = request(live.url, "GET", "/metrics")[2]
    assert re.search(rb"aioworker_api_client_disconnects_total (\S+)", gateway)[1] != b"0.0"
