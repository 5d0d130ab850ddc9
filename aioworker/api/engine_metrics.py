"""The engine's metrics on the gateway's /metrics, named as the ranks name theirs (`aioworker:`,
the shapes vLLM's dashboards read) and labelled `model_name`: requests by finish reason, tokens,
and TTFT, inter-token and end-to-end latency as the gateway sees each request; running and
waiting requests, KV cache usage, prefix-cache tokens and the host KV tier's figures from each
group's latest driver heartbeat (labelled `group` too), read when scraped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from aioworker.wire.gauges import STATE_GAUGES
from aioworker.wire.protocol import Heartbeat

# Seconds. A prefill takes 10 ms to minutes; a decode step a few ms to a second.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 640)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                     0.5, 0.75, 1, 2.5, 5, 10)  # fmt: skip


class EngineMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        heartbeats: Callable[[], list[Heartbeat | None]],
    ) -> None:
        self.model_name = model_name
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]):
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(
                model_name
            )

        def counter(name: str, doc: str):
            return Counter(name, doc, labels, registry=registry).labels(model_name)

        self.ttft = histogram(
            "aioworker:time_to_first_token_seconds",
            "Arrival at the gateway to the first token.",
            LATENCY_BUCKETS,
        )
        self.itl = histogram(
            "aioworker:time_per_output_token_seconds",
            "Time between a choice's consecutive outputs, as the gateway receives them.",
            TOKEN_GAP_BUCKETS,
        )
        self.e2e = histogram(
            "aioworker:e2e_request_latency_seconds",
            "Arrival at the gateway to the request's end.",
            LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter("aioworker:prompt_tokens_total", "Prompt tokens sent.")
        self.generation_tokens = counter("aioworker:generation_tokens_total", "Tokens generated.")
        self.finished = Counter(
            "aioworker:request_success_total",
            "Requests ended, by reason (stop, length, abort, error).",
            ["model_name", "finished_reason"],
            registry=registry,
        )
        registry.register(HeartbeatGauges(model_name, heartbeats))

    def clock(self, arrived: float) -> RequestClock:
        return RequestClock(self, arrived)


class RequestClock:
    """One request's times as the gateway sees them, observed as they happen."""

    def __init__(self, metrics: EngineMetrics, arrived: float) -> None:
        """`arrived`: time.perf_counter() when the request came."""
        self.metrics = metrics
        self.arrived = arrived
        self.first_token_at: float | None = None
        self._last_output_at: dict[int, float] = {}  # by choice index

    def on_output(self, choice_index: int, num_tokens: int) -> None:
        if not num_tokens:
            return
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
            self.metrics.ttft.observe(now - self.arrived)
        last = self._last_output_at.get(choice_index)
        if last is not None:
            self.metrics.itl.observe(now - last)
        self._last_output_at[choice_index] = now

    def on_end(self, finish_reasons: list[str], num_generated: int) -> None:
        metrics = self.metrics
        metrics.e2e.observe(time.perf_counter() - self.arrived)
        metrics.generation_tokens.inc(num_generated)
        for reason in finish_reasons:
            metrics.finished.labels(metrics.model_name, reason).inc()


class HeartbeatGauges(Collector):
    """Gauges read from the groups' latest heartbeats when /metrics is scraped."""

    def __init__(self, model_name: str, heartbeats: Callable[[], list[Heartbeat | None]]) -> None:
        self.model_name = model_name
        self.heartbeats = heartbeats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        beats = self.heartbeats()
        for name, doc, read in STATE_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["model_name", "group"])
            for group, beat in enumerate(beats):
                if beat is not None:
                    family.add_metric([self.model_name, str(group)], float(read(beat)))
            yield family
