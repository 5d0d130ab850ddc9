"""Prometheus metrics of a driver rank, served over HTTP by prometheus_client on its own thread.

Gauges are read when scraped (no cost on the hot path), except the weights' of each rank, set once
loaded; counters and histograms are updated once per request or once per step, never once per
token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from aioworker.core.expert_load import ExpertLoad, imbalance, tokens_per_step
from aioworker.runtime.heartbeat import ServingInfo
from aioworker.wire.gauges import STATE_GAUGES

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class WorkerMetrics:
    def __init__(
        self,
        group: int,
        port: int,
        host: str,
        serving_info: Callable[[], ServingInfo],
        weights_per_rank: list[dict[str, Any]],
        expert_loads: Callable[[], dict[int, ExpertLoad]] = dict,
    ) -> None:
        """`weights_per_rank`: each rank's quantization and weight bytes, fixed once the group
        has loaded (Driver.weights_per_rank); `expert_loads`: each rank's latest expert load
        (MoE models), read when scraped."""
        self.registry = CollectorRegistry()
        self.registry.register(ExpertLoadCollector(str(group), expert_loads))
        label = str(group)

        def gauge(name: str, doc: str, read) -> None:
            Gauge(name, doc, ["group"], registry=self.registry).labels(label).set_function(read)

        for name, doc, read in STATE_GAUGES:
            gauge(name, doc, lambda read=read: read(serving_info()))
        self._weights_gauges(label, weights_per_rank)
        self.ttft = self._histogram(
            "aioworker:time_to_first_token_seconds", "Submit to first token.", label
        )
        self.itl = self._histogram(
            "aioworker:time_per_output_token_seconds",
            "Time between a step's tokens and the previous step's.",
            label,
        )
        self.e2e = self._histogram(
            "aioworker:e2e_request_latency_seconds", "Submit to terminal output.", label
        )
        self.prompt_tokens = self._counter(
            "aioworker:prompt_tokens_total", "Prompt tokens admitted.", label
        )
        self.generation_tokens = self._counter(
            "aioworker:generation_tokens_total", "Tokens generated.", label
        )
        self.finished = Counter(
            "aioworker:request_success_total",
            "Requests ended, by reason.",
            ["group", "finished_reason"],
            registry=self.registry,
        )
        self.group = label
        self._last_step_at: float | None = None
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, port)

    def _weights_gauges(self, group: str, weights_per_rank: list[dict[str, Any]]) -> None:
        labels = ["group", "rank", "quantization"]
        held = Gauge(
            "aioworker:weight_bytes_held",
            "Bytes of every weight tensor a rank holds (quantized and packed copies included).",
            labels,
            registry=self.registry,
        )
        read = Gauge(
            "aioworker:weight_bytes_read_per_step",
            "Bytes of weight a rank reads per decode step.",
            labels,
            registry=self.registry,
        )
        for rank in weights_per_rank:
            values = (group, str(rank["rank"]), rank["quantization"])
            held.labels(*values).set(rank["weight_bytes_held"])
            read.labels(*values).set(rank["weight_bytes_read"])

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


# Tokens per expert per step (per MoE layer): decode at batch 1 with top-8 of 128 puts 0.06 on
# each expert on average, a 4,096-token prefill 256.
_EXPERT_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000, 3000)


class ExpertLoadCollector:
    """MoE models: per rank, the histogram of its experts' loads (each expert's tokens per step
    per layer since the rank started: one observation per expert, so a wide spread is an
    imbalance) and the busiest expert's load over the mean. Built when scraped."""

    def __init__(self, group: str, expert_loads: Callable[[], dict[int, ExpertLoad]]) -> None:
        self.group, self.expert_loads = group, expert_loads

    def collect(self):
        loads = self.expert_loads()
        if not loads:
            return
        histogram = HistogramMetricFamily(
            "aioworker:expert_tokens_per_step",
            "Each of a rank's experts' tokens per step per MoE layer, since it started.",
            labels=["group", "rank"],
        )
        spread = GaugeMetricFamily(
            "aioworker:expert_load_imbalance",
            "A rank's busiest expert's tokens over its experts' mean (1 = even).",
            labels=["group", "rank"],
        )
        for rank, load in loads.items():
            per_expert = tokens_per_step(load)
            labels = [self.group, str(rank)]
            histogram.add_metric(labels, _buckets(per_expert), sum_value=sum(per_expert))
            spread.add_metric(labels, imbalance(per_expert))
        yield histogram
        yield spread


def _buckets(values: list[float]) -> list[tuple[str, int]]:
    """Cumulative counts per upper bound, as Prometheus histograms are written."""
    bounds = [*(str(b) for b in _EXPERT_BUCKETS), "+Inf"]
    limits = [*_EXPERT_BUCKETS, float("inf")]
    return [
        (bound, sum(v <= limit for v in values))
        for bound, limit in zip(bounds, limits, strict=True)
    ]
