"""Prometheus metrics of a driver rank, served over HTTP by prometheus_client on its own thread.

Gauges are read when scraped (no cost on the hot path); counters and histograms are updated once
per request or once per step, never once per token.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class WorkerMetrics:
    def __init__(self, driver, port: int, host: str) -> None:
        self.registry = CollectorRegistry()
        group = str(driver.group)

        def gauge(name: str, doc: str, read) -> None:
            Gauge(name, doc, ["group"], registry=self.registry).labels(group).set_function(read)

        def depth(index: int) -> float:
            return float(driver.queue_depths()[index])

        gauge("aioworker:num_requests_running", "Requests being computed.", lambda: depth(0))
        gauge("aioworker:num_requests_waiting", "Requests queued for admission.", lambda: depth(1))
        gauge(
            "aioworker:kv_cache_usage_perc",
            "Fraction of KV blocks in use (0 to 1).",
            lambda: _usage(driver),
        )
        self.ttft = self._histogram(
            "aioworker:time_to_first_token_seconds", "Submit to first token.", group
        )
        self.itl = self._histogram(
            "aioworker:time_per_output_token_seconds",
            "Time between a step's tokens and the previous step's.",
            group,
        )
        self.e2e = self._histogram(
            "aioworker:e2e_request_latency_seconds", "Submit to terminal output.", group
        )
        self.prompt_tokens = self._counter(
            "aioworker:prompt_tokens_total", "Prompt tokens admitted.", group
        )
        self.generation_tokens = self._counter(
            "aioworker:generation_tokens_total", "Tokens generated.", group
        )
        self.finished = Counter(
            "aioworker:request_success_total",
            "Requests ended, by reason.",
            ["group", "finished_reason"],
            registry=self.registry,
        )
        self.group = group
        self._last_step_at: float | None = None
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, port)

    def _histogram(self, name: str, doc: str, group: str):
        return Histogram(
            name, doc, ["group"], buckets=_LATENCY_BUCKETS, registry=self.registry
        ).labels(group)

    def _counter(self, name: str, doc: str, group: str):
        return Counter(name, doc, ["group"], registry=self.registry).labels(group)

    def on_step(self, num_tokens: int) -> None:
        now = time.monotonic()
        if self._last_step_at is not None and num_tokens:
            self.itl.observe(now - self._last_step_at)
        self._last_step_at = now
        self.generation_tokens.inc(num_tokens)

    def on_finished(self, arrival: float, reason: str) -> None:
        self.e2e.observe(time.monotonic() - arrival)
        self.finished.labels(self.group, reason).inc()


def _usage(driver) -> float:
    _, _, used, total = driver.queue_depths()
    return used / total if total else 0.0
