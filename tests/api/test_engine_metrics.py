"""The gateway's /metrics carries the engine's metrics labelled by model name, from its own view
of each request and from the groups' heartbeats; and the shipped Grafana dashboard queries only
metrics that exist there."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aioworker.checkpoint.tokenizer import Tokenizer
from tests.api.inprocess import MODEL, ServedGateway
from tests.api.service import open_stream, request

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana" / "aioworker.json"
# Three blocks of 16 tokens: the second request finds them in the prefix cache.
BODY = {"model": MODEL, "prompt": [5] * 48, "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory, embedded_model_dir) -> tuple[dict, str, list[dict]]:
    """Samples by (name, labels) after two whole requests and one left mid-stream."""
    tokenizer = Tokenizer(embedded_model_dir)
    runtime_dir = tmp_path_factory.mktemp("metrics")
    with ServedGateway(runtime_dir, tokenizer, step_seconds=0.01) as served:
        answers = [json.loads(request(served.url, "POST", "/v1/completions", BODY)[2])]
        answers.append(json.loads(request(served.url, "POST", "/v1/completions", BODY)[2]))
        sock, _ = open_stream(
            served.url, "/v1/completions", {**BODY, "max_tokens": 500, "stream": True}
        )
        sock.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = request(served.url, "GET", "/metrics")[2].decode()
            hits = re.search(
                r'prefix_cache_hit_tokens\{group="0",model_name="embedded"\} (\S+)', text
            )
            if 'finished_reason="abort"' in text and hits and float(hits[1]) > 0:
                break
            time.sleep(0.05)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return samples, text, answers


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model_name": MODEL, **labels}.items())))]


def test_requests_and_tokens_as_the_gateway_saw_them(scraped) -> None:
    samples, _, answers = scraped
    assert value(samples, "aioworker:request_success_total", finished_reason="length") == 2
    assert value(samples, "aioworker:request_success_total", finished_reason="abort") == 1
    prompt_tokens = sum(a["usage"]["prompt_tokens"] for a in answers)
    assert value(samples, "aioworker:prompt_tokens_total") == prompt_tokens * 3 / 2
    assert value(samples, "aioworker:generation_tokens_total") >= 12


def test_latency_histograms_count_each_request_and_token_gap(scraped) -> None:
    samples, _, _ = scraped
    assert value(samples, "aioworker:time_to_first_token_seconds_count") == 3
    assert value(samples, "aioworker:e2e_request_latency_seconds_count") == 3
    # Six tokens, one per step: five gaps per whole request, and some for the one that left.
    assert value(samples, "aioworker:time_per_output_token_seconds_count") >= 10


def test_group_gauges_come_from_the_heartbeats(scraped) -> None:
    samples, _, _ = scraped
    for name in (
        "aioworker:num_requests_running",
        "aioworker:num_requests_waiting",
        "aioworker:kv_cache_usage_perc",
        "aioworker:prefix_cache_hit_tokens",
        "aioworker:prefix_cache_queried_tokens",
        "aioworker:prefix_cache_blocks",
        "aioworker:spec_decode_num_draft_tokens",
        "aioworker:spec_decode_num_accepted_tokens",
        "aioworker:spec_decode_num_verified",
    ):
        assert value(samples, name, group="0") >= 0
    queried = value(samples, "aioworker:prefix_cache_queried_tokens", group="0")
    assert 0 < value(samples, "aioworker:prefix_cache_hit_tokens", group="0") < queried


def test_every_metric_the_dashboard_queries_is_served(scraped) -> None:
    _, text, _ = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["definition"])
    queried = {m for expr in exprs for m in re.findall(r"\baioworker[a-z_:]*", expr)}
    served = set(re.findall(r"^(aioworker[a-z_:]*)", text, re.MULTILINE))
    assert len(queried) >= 10 and queried <= served, queried - served
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("requests", "token", "first token", "inter-token", "queue", "kv", "prefix"):
        assert topic in titles
