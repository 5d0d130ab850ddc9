"""One gauge table serves a rank's metrics (from its ServingInfo) and the gateway's (from the
driver's heartbeat): both read the same figures alike, and the gateway exposes the host KV
tier's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aioworker.api.engine_metrics import HeartbeatGauges
from aioworker.runtime.heartbeat import HOST_KV_FIELDS, ServingInfo
from aioworker.wire.gauges import STATE_GAUGES
from aioworker.wire.protocol import Heartbeat

HOST_TIER = dict(
    host_kv_blocks_total=4096, host_kv_blocks_used=120, host_kv_blocks_cached=100,
    host_kv_hit_blocks=37, host_kv_saved_blocks=250, host_kv_swaps_out=3, host_kv_swaps_in=2,
    host_kv_copy_failures=1, host_kv_bytes_saved=250 << 16, host_kv_bytes_loaded=37 << 16,
    host_kv_ms_saving=1500.0, host_kv_ms_loading=250.5,
)  # fmt: skip


def driver_beat(**fields) -> Heartbeat:
    return Heartbeat(
        group=0, rank=0, pid=1, state="READY", step_id=0, step_elapsed_s=0.0, num_running=0,
        num_waiting=0, kv_blocks_used=0, kv_blocks_total=64, tokens_per_s=0.0,
        weights_version=0, interval_s=1.0, sent_at=0.0, **fields,
    )  # fmt: skip


def test_a_beat_and_a_serving_info_read_alike() -> None:
    beat, info = driver_beat(**HOST_TIER), ServingInfo(**HOST_TIER)
    assert set(HOST_KV_FIELDS) == set(HOST_TIER)
    for name, _, read in STATE_GAUGES:
        assert read(beat) == read(info), name


def test_the_gateway_exposes_a_drivers_host_tier() -> None:
    registry = CollectorRegistry()
    registry.register(HeartbeatGauges("m", lambda: [driver_beat(**HOST_TIER), driver_beat()]))
    samples = {
        (sample.labels["group"], sample.name): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name.startswith("aioworker:host_kv_")
    }
    assert {name: value for (group, name), value in samples.items() if group == "0"} == {
        "aioworker:host_kv_blocks_total": 4096, "aioworker:host_kv_blocks_used": 120,
        "aioworker:host_kv_blocks_cached": 100, "aioworker:host_kv_hit_blocks": 37,
        "aioworker:host_kv_saved_blocks": 250, "aioworker:host_kv_swaps_out": 3,
        "aioworker:host_kv_swaps_in": 2, "aioworker:host_kv_copy_failures": 1,
        "aioworker:host_kv_bytes_saved": 250 << 16, "aioworker:host_kv_bytes_loaded": 37 << 16,
        "aioworker:host_kv_save_seconds": 1.5, "aioworker:host_kv_load_seconds": 0.2505,
    }  # fmt: skip
    # A group without a tier reads 0 throughout.
    assert {value for (group, _), value in samples.items() if group == "1"} == {0}
