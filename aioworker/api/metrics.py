"""Prometheus metrics of the gateway: its own (requests by endpoint and status, requests in
flight, time to the first streamed token, tokens in and out, disconnects) and the engine's as
the gateway sees them (engine_metrics.py)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from aioworker.api.engine_metrics import EngineMetrics
from aioworker.wire.protocol import Heartbeat

# Seconds: the gateway adds well under a millisecond; a model's prefill takes 10 ms to seconds.
FIRST_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ApiMetrics:
    def __init__(self, model_name: str, heartbeats: Callable[[], list[Heartbeat | None]]) -> None:
        self.registry = CollectorRegistry()
        self.engine = EngineMetrics(self.registry, model_name, heartbeats)
        self.requests = Counter(
            "aioworker_api_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "aioworker_api_requests_in_flight", "requests being answered", registry=self.registry
        )
        self.first_token = Histogram(
            "aioworker_api_time_to_first_token_seconds",
            "from the request's arrival to its first output from the workers",
            buckets=FIRST_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "aioworker_api_prompt_tokens", "prompt tokens submitted", registry=self.registry
        )
        self.generation_tokens = Counter(
            "aioworker_api_generation_tokens", "tokens generated", registry=self.registry
        )
        self.disconnects = Counter(
            "aioworker_api_client_disconnects",
            "requests whose HTTP client left before the answer was complete (aborted)",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
