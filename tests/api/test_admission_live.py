"""Admission over HTTP, against a fake-executor worker and `aioworker api`: a full queue answers
429 with Retry-After. (Readiness, and the 503 naming each group's state: test_readiness_live.)"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.api.service import healthy, open_stream, request
from tests.processes import Process
from tests.workers import deployment

pytestmark = pytest.mark.slow
BODY = {"model": "embedded", "prompt": "Hello", "max_tokens": 5}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory):
    config, set_args = deployment(
        **{
            "runtime.runtime_dir": str(tmp_path_factory.mktemp("api-fake")),
            "scheduler.max_num_seqs": 1,
            "scheduler.max_waiting": 1,
            "api.retry_after_s": 3,
        }
    )
    worker = Process(
        ["worker", "--rank", "0", "--fake-executor", "--fake-step-ms", "100", *set_args]
    )
    api = Process(["api", "--port", "0", "--model", "embedded", *set_args])
    with healthy(worker, api) as url:
        yield url, config


def test_a_full_queue_answers_429_with_retry_after(fake) -> None:
    """One request runs (max_num_seqs 1) and holds the only seat; of five more sent together,
    exactly one may wait (max_waiting 1) and four are refused at once. Streaming the first
    before the burst makes this independent of how fast the machine schedules."""
    url, _ = fake
    stream, _ = open_stream(url, "/v1/completions", {**BODY, "max_tokens": 400, "stream": True})
    with ThreadPoolExecutor(5) as pool:
        burst = [pool.submit(request, url, "POST", "/v1/completions", BODY) for _ in range(5)]
        refused = wait_until_done(burst, count=4)
        stream.close()  # the worker aborts it, and the waiting request runs
        answers = [future.result() for future in burst]
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 429, 429, 429, 429], statuses
    status, headers, body = refused[0].result()
    assert status == 429 and headers["retry-after"] == "3"
    error = json.loads(body)["error"]
    assert error["type"] == "rate_limit_error" and "max_waiting" in error["message"]


def wait_until_done(futures: list[Future], count: int, timeout: float = 30) -> list[Future]:
    deadline = time.monotonic() + timeout
    while len(done := [f for f in futures if f.done()]) < count:
        assert time.monotonic() < deadline, f"only {len(done)} of {count} answered"
        time.sleep(0.02)
    return done
