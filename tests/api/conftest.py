"""One live service for the module that asks for it: `aioworker serve --api-port 0` over the
embedded model (ranks and HTTP server under one launcher), and an `openai` client of it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from aioworker.config import WorkerConfig
from tests.api.service import api_url, free_port, wait_healthy
from tests.conftest import EMBEDDED_OVERRIDES
from tests.processes import Process
from tests.workers import deployment


@dataclass
class Live:
    url: str
    config: WorkerConfig
    set_args: list[str]
    worker_metrics_port: int
    process: Process

    def openai(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    metrics_port = free_port()
    config, set_args = deployment(
        **EMBEDDED_OVERRIDES,
        **{
            "runtime.runtime_dir": str(tmp_path_factory.mktemp("api-live")),
            "runtime.metrics_port": metrics_port,
        },
    )
    process = Process(["serve", "--model", "embedded", "--api-port", "0", *set_args])
    try:
        url = api_url(process)
        wait_healthy(url, process, timeout=180)
        yield Live(url, config, set_args, metrics_port, process)
    finally:
        process.stop()
    # SIGTERM: the ranks drained and the HTTP server stopped cleanly (not killed by the signal).
    assert process.process.returncode == 0, process.log
    assert re.search(r"api server \(pid \d+\) exited with code 0", process.log), process.log
