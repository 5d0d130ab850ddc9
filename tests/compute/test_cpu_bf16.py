"""model.dtype "auto" on the CPU: bfloat16 where the processor computes it (AVX512-BF16, AMX),
float32 elsewhere (bf16 converted for every product is slower than float32)."""

from __future__ import annotations

import torch

from aioworker.compute import build_rank, cpu_bf16
from aioworker.core.sampling_params import SamplingParams


def test_native_bf16_is_avx512_bf16_or_amx() -> None:
    assert cpu_bf16.computes_bf16_natively({"avx512f", "avx512_bf16"})
    assert cpu_bf16.computes_bf16_natively({"amx_bf16", "amx_tile"})
    assert not cpu_bf16.computes_bf16_natively({"avx2", "avx512f"})


def test_auto_follows_the_processor_and_a_named_dtype_wins(monkeypatch) -> None:
    cpu = torch.device("cpu")
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(build_rank, "computes_bf16_natively", lambda native=native: native)
        assert build_rank.pick_dtype("auto", cpu, None) == expected
        assert build_rank.pick_dtype("float32", cpu, None) == torch.float32


def test_an_engine_on_auto_holds_its_weights_in_the_dtype_picked(embedded_model_dir) -> None:
    from tests.conftest import make_engine

    expected = torch.bfloat16 if cpu_bf16.computes_bf16_natively() else torch.float32
    engine = make_engine(embedded_model_dir, **{"model.dtype": "auto"})
    try:
        model = engine.executor.runner.model
        assert model.lm_head.weight.dtype == expected
        [completion] = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(completion.token_ids) == 4
    finally:
        engine.close()
