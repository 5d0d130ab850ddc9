"""A driver's Prometheus metrics say what every rank's weights amount to: bytes held and read per
step, by rank, labelled with the quantization; and what its host KV tier holds and has copied."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from aioworker.core.fake_executor import FAKE_WEIGHT_BYTES_HELD, FAKE_WEIGHT_BYTES_READ
from tests.runtime.inprocess import inprocess_config, run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_weight_bytes_per_rank_with_the_quantization(tmp_path, distinct_weights) -> None:
    port = free_port()
    settings = {"parallel.tensor_parallel_size": 2, "model.quantization": "wint8"}
    config = inprocess_config(tmp_path, **settings, **{"runtime.metrics_port": port})

    async def scenario(group, client) -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())

    text, _ = run(scenario, config)
    samples = {
        (sample.name, sample.labels["rank"]): (sample.labels, sample.value)
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if sample.name.startswith("aioworker:weight_bytes")
    }
    for rank in ("0", "1"):
        labels = {"group": "0", "rank": rank, "quantization": "wint8"}
        held = FAKE_WEIGHT_BYTES_HELD + (int(rank) << 20)
        assert samples["aioworker:weight_bytes_held", rank] == (labels, held)
        assert samples["aioworker:weight_bytes_read_per_step", rank] == (
            labels,
            FAKE_WEIGHT_BYTES_READ,
        )
    assert len(samples) == 4


def test_the_host_tier_gauges_read_the_drivers_figures(tmp_path, host_tier) -> None:
    port = free_port()
    config = inprocess_config(tmp_path, **{"runtime.metrics_port": port})

    async def scenario(group, client) -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())

    text, _ = run(scenario, config)
    samples = {
        sample.name: (sample.labels, sample.value)
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if sample.name.startswith("aioworker:host_kv")
    }
    group = {"group": "0"}
    assert samples["aioworker:host_kv_blocks_total"] == (group, 4096)
    assert samples["aioworker:host_kv_blocks_used"] == (group, 120)
    assert samples["aioworker:host_kv_hit_blocks"] == (group, 37)
    assert samples["aioworker:host_kv_bytes_saved"] == (group, 250 << 16)
    assert samples["aioworker:host_kv_save_seconds"] == (group, 1.5)
    assert samples["aioworker:host_kv_load_seconds"] == (group, 0.2505)
    assert len(samples) == len(host_tier)  # one gauge per figure
