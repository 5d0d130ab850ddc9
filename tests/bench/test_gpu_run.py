"""W1 against a candidate (the GPU parts replaced): one engine per side, built with the side's
settings, its runs' median in the table, and the ratio in the notes. A W1 run starts with an
empty prefix cache."""

from __future__ import annotations

from aioworker.bench import gpu, gpu_prefix, gpu_run
from aioworker.bench.step_timeline import StepRecord


def test_w1_candidate_builds_an_engine_per_side_and_reports_medians(monkeypatch) -> None:
    built, freed = [], []
    rates = {"defaults": iter([100.0, 120.0, 110.0]), "candidate": iter([130.0, 150.0, 140.0])}

    def fake_engine(model_dir, max_model_len, **settings):
        built.append(settings)
        return "candidate" if settings else "defaults"

    def fake_run(engine, logprobs=None, timeline=None):
        rate = next(rates[engine])
        timeline.steps.append(StepRecord(4, 0, rate / 100, 0.1))  # each run's own decode time
        return rate, 1000

    monkeypatch.setattr(gpu, "make_engine", fake_engine)
    monkeypatch.setattr(gpu, "w1_tokens_per_s", fake_run)
    monkeypatch.setattr(gpu, "free", freed.append)
    limits = gpu.Limits(copy_bytes_per_s=4e12, matmul_flop_per_s=7e14)
    table, notes = gpu_run.run_w1(limits, {"device.pdl": True})
    assert built == [{}, {"device.pdl": True}]
    assert freed == ["defaults", "candidate"]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if "|" in line}
    assert "110" in rows["defaults"] and "140" in rows["candidate"]
    assert "device.pdl=True" in notes and "1.273" in notes
    # the defaults' last run (110 tok/s: 1.20 s) and first (100: 1.10 s); no candidate run's
    last, first = notes.split("warm up: ")
    assert "1.20 s" in last.split("time went")[1] and "1.10 s" in first
    assert not any(f"{rate / 100 + 0.1:.2f} s" in notes for rate in (130, 150, 140))


class _RecordingEngine:
    """Records generate calls and prefix-cache resets, in order; `core` is itself."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.core = self

    def generate(self, prompts, params):
        self.calls.append(f"generate {len(prompts)}")
        return []

    def reset_prefix_cache(self) -> int:
        self.calls.append("reset")
        return 0


def test_a_w1_run_starts_with_nothing_cached() -> None:
    """Every run draws the same prompts: the cache is emptied after the warm-up, right before
    the timed run, so no run reuses a prefill from an earlier one (the candidate's runs on
    one engine did before 2026-12-06)."""
    engine = _RecordingEngine()
    for _ in range(2):
        _, output_tokens = gpu.w1_tokens_per_s(engine)
        assert output_tokens == 133_966  # nano-vllm's draws (test_nano_vllm_draws.py)
    assert engine.calls == ["generate 4", "reset", "generate 256"] * 2


def test_plain_w1_reports_the_first_runs_breakdown_beside_the_last(monkeypatch) -> None:
    """The first run on a new engine pays its warm-up (6-20% slower on the GPU): its steps by
    kind are printed beside the last plain run's, so the two can be compared."""
    calls = []

    def fake_run(engine, logprobs=None, timeline=None):
        calls.append(logprobs)
        prefill_tokens = 100 * len(calls)  # each run's steps differ, so the summaries do
        timeline.steps.append(StepRecord(4, prefill_tokens, 0.5 + len(calls), 0.1))
        return 1000.0 + len(calls), 5000

    monkeypatch.setattr(gpu_run, "load_model_config", lambda path: None)
    monkeypatch.setattr(gpu, "kv_bytes_per_token", lambda cfg: 114_688)
    monkeypatch.setattr(gpu, "make_engine", lambda *args, **kwargs: "engine")
    monkeypatch.setattr(gpu, "free", lambda engine: None)
    monkeypatch.setattr(gpu, "w1_tokens_per_s", fake_run)
    monkeypatch.setattr(gpu_prefix, "set_prefix_caching", lambda engine, on: None)
    limits = gpu.Limits(copy_bytes_per_s=4e12, matmul_flop_per_s=7e14)
    _, notes = gpu_run.run_w1(limits)
    plain_runs = len(gpu_run.W1_VARIANTS) * (gpu_run.W1_REPEATS - 1) + 1  # the last plain run
    last, first = notes.split("warm up: ")[0], notes.split("warm up: ")[1]
    assert f"{0.6 + plain_runs:.2f} s" in last.split("time went")[1]
    assert "1.60 s" in first and f"{0.6 + plain_runs:.2f} s" not in first
