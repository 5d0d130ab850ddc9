"""W9's whole path on the CPU at a toy scale (the embedded model): the tier side loads history
back from the host, greedy answers equal the tier off, and the GPU run's tables format."""

from __future__ import annotations

import pytest

from aioworker.bench import gpu_host_tier, gpu_host_tier_run
from aioworker.bench.gpu import kv_bytes_per_token
from aioworker.checkpoint.model_config import load_model_config
from tests.conftest import make_engine

BLOCK = 16
TOY = gpu_host_tier.ChatScale(
    num_users=3, num_turns=2, system_tokens=40, message_tokens=(4, 8), new_tokens=8
)


@pytest.mark.slow
def test_a_toy_chat_hits_the_host_tier_and_answers_as_without_it(embedded_model_dir) -> None:
    cfg = load_model_config(embedded_model_dir)
    block_bytes = kv_bytes_per_token(cfg, element_size=4) * BLOCK  # the tests run float32
    lines: list[str] = []
    result = gpu_host_tier.both_ways(
        lambda **overrides: make_engine(embedded_model_dir, **overrides),
        lambda engine: engine.close(),
        TOY,
        BLOCK,
        block_bytes,
        lines.append,
    )
    off, on = result.off, result.on
    assert result.sizing.working_set_blocks > result.sizing.num_device_blocks
    assert on.kv_block_bytes == block_bytes
    assert on.tier_counts["host_kv_hit_blocks"] > 0
    assert on.tier_counts["host_kv_bytes_loaded"] > 0 and on.tier_counts["host_kv_ms_loading"] > 0
    assert off.tier_counts == {}
    assert on.answers == off.answers
    assert off.num_output_tokens == on.num_output_tokens == 3 * 2 * 8
    assert [len(turns) for turns in on.ttft_s] == [2, 2, 2]
    assert lines[0].startswith("W9: working set") and lines[-1].startswith("W9 tier on: done")

    pinned = gpu_host_tier_run.PinnedCopies(host_to_device=50e9, device_to_host=40e9)
    counts = {"host_kv_saved_blocks": 4, "host_kv_hit_blocks": 0}
    w1 = gpu_host_tier_run.W1Side([100.0, 98.0, 99.0], 300, counts)
    assert "| host tier on " in gpu_host_tier_run.chat_table(result, TOY)
    assert "host to device (loads)" in gpu_host_tier_run.copies_table(on.tier_counts, pinned)
    assert "| 99 " in gpu_host_tier_run.w1_table(w1, w1)
    assert "6 of 6" in gpu_host_tier_run.notes(result, TOY, w1, w1)


def test_the_issue_sizes_keep_the_working_set_four_times_the_device_kv() -> None:
    scale = gpu_host_tier.ChatScale()
    conversations = gpu_host_tier.draw(scale)
    sizing = gpu_host_tier.size(conversations, scale, BLOCK, 2 << 20)  # Llama-3.1-8B, bf16
    histories = [gpu_host_tier.final_history_tokens(c, scale) for c in conversations]
    assert sizing.working_set_blocks == sum(-(-h // BLOCK) for h in histories)
    assert 3.99 < sizing.working_set_blocks / sizing.num_device_blocks <= 4.0
    assert sizing.host_kv_bytes // sizing.block_bytes >= 1.1 * sizing.working_set_blocks
    assert sizing.host_kv_bytes & (sizing.host_kv_bytes - 1) == 0  # what pinning rounds up to
    assert sizing.max_model_len >= max(histories)
