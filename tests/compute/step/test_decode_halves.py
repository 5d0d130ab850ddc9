"""A large decode step run as two halves of its batch (device.decode_halves_from): the same
logits and the same KV written as one chain, and only where its streams are safe."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.step.decode_halves import (  # noqa: E402
    MIN_BATCH,
    DecodeHalves,
    MarksFirstAttention,
)

CPU = torch.device("cpu")


def test_only_decode_batches_from_the_threshold_and_never_under_the_floor_take_halves() -> None:
    halves = DecodeHalves(128, lambda batch: 1, None, CPU)
    assert halves.takes(128, 1) and halves.takes(256, 1)
    assert not halves.takes(112, 1)
    assert not halves.takes(128, 4)  # verify steps keep one chain
    assert DecodeHalves(4, lambda batch: 1, None, CPU).from_batch == MIN_BATCH
    assert not DecodeHalves(4, lambda batch: 1, None, CPU).takes(MIN_BATCH - 1, 1)
    off = DecodeHalves(0, lambda batch: 1, None, CPU)
    assert not off.takes(256, 1) and off.side is None


def test_each_half_runs_its_own_rows_with_its_own_split_count() -> None:
    calls = []

    def hidden_of(token_ids, positions, rows, query_lens, num_splits, backend):
        calls.append((rows.tolist(), num_splits, type(backend).__name__))
        return token_ids.float().unsqueeze(1) * 2

    backend = types.SimpleNamespace()
    halves = DecodeHalves(18, lambda batch: batch + 100, backend, CPU)
    ids = torch.arange(21)
    hidden = halves.hidden(hidden_of, ids, ids, ids + 50)
    assert calls == [
        (list(range(50, 60)), 110, "MarksFirstAttention"),  # the side chain starts from it
        (list(range(60, 71)), 111, "SimpleNamespace"),
    ]
    assert torch.equal(hidden, ids.float().unsqueeze(1) * 2)


class Recorded:
    def __init__(self) -> None:
        self.records = 0

    def record(self) -> None:
        self.records += 1


def test_the_first_attention_marks_the_event_once_and_everything_else_passes_through() -> None:
    backend = types.SimpleNamespace(
        attend=lambda *args: None if args[0] == "skip" else ("attended", args),
        forward=lambda *args: ("forward", args),
        prepare_qkv=lambda *args: "prepared",
        block_size=16,
    )
    event = Recorded()
    marks = MarksFirstAttention(backend, event)
    assert marks.block_size == 16 and marks.prepare_qkv(1) == "prepared"
    assert marks.attend("skip") is None and event.records == 0  # no attention yet
    assert marks.forward(1, 2) == ("forward", (1, 2)) and event.records == 1
    assert marks.attend(3) == ("attended", (3,)) and event.records == 1  # the first only
    plain = MarksFirstAttention(types.SimpleNamespace(forward=lambda *a: "f"), Recorded())
    assert plain.attend(1) is None  # a backend without attend: attend through forward
    assert plain.forward() == "f" and plain.event is None


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    """Two CUDA runners over one tiny Qwen3 model and one KV cache (on the CPU, Triton's
    interpreter), one with halves from 18 sequences and one without."""
    from aioworker.checkpoint.model_config import load_model_config
    from aioworker.compute.kv_cache import allocate_kv_cache
    from aioworker.compute.layers.attention import select_cuda_backend
    from aioworker.compute.model_loading import build_model, linear_methods
    from aioworker.compute.parallel import SINGLE
    from aioworker.compute.sampling.sampler import Sampler
    from aioworker.compute.step.cuda_runner import CudaModelRunner
    from aioworker.config import load_config
    from tests.tiny_models import build_tiny_model

    patch = pytest.MonkeyPatch()
    sms = types.SimpleNamespace(multi_processor_count=8)
    patch.setattr(torch.cuda, "get_device_properties", lambda device: sms)
    path = tmp_path_factory.mktemp("qwen3")
    build_tiny_model("qwen3", path)
    cfg = load_model_config(path)
    config = load_config(overrides={"model.path": str(path), "device.kind": "cpu"})
    model = build_model(cfg, 64, SINGLE, CPU, torch.float32, linear_methods(cfg, config, CPU))
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.1)
    layers = model.attention_layers()
    allocate_kv_cache(layers, 41, 16, torch.float32, CPU)  # a block per row and the scratch
    for layer in layers:
        layer.k_cache.normal_()
        layer.v_cache.normal_()

    def runner(halves_from: int):
        made = CudaModelRunner(
            model, select_cuda_backend(config.device, 16), Sampler(0, CPU, one_pass=False), CPU,
            SINGLE, block_size=16, num_blocks=40, max_num_seqs=40, max_model_len=64,
            max_capture_batch_size=0, decode_halves_from=halves_from,
        )  # fmt: skip
        made.block_table_matrix[:40, 0] = torch.arange(40, dtype=torch.int32)  # row r: block r
        return made

    yield runner(18), runner(0), layers
    patch.undo()


@pytest.mark.parametrize("batch", [20, 21])
def test_halves_give_one_chain_s_logits_and_kv(runners, batch: int) -> None:
    """Each sequence decodes at its own position over KV already in its block; the odd batch
    splits 10 and 11."""
    halved, whole, layers = runners
    assert halved.halves.takes(batch, 1) and not whole.halves.takes(batch, 1)
    generator = torch.Generator().manual_seed(batch)
    token_ids = torch.randint(0, 100, (batch,), generator=generator)
    positions = torch.randint(1, 16, (batch,), generator=generator)
    rows = torch.randperm(40, generator=generator)[:batch]
    before = [layer.k_cache.clone() for layer in layers]

    def step(runner):
        for layer, cache in zip(layers, before, strict=True):
            layer.k_cache.copy_(cache)
        with torch.no_grad():
            logits = runner.graph_forward(token_ids, positions, rows, None, 1)
        return logits, [layer.k_cache.clone() for layer in layers]

    logits, caches = step(halved)
    expected, expected_caches = step(whole)
    assert logits.shape == expected.shape == (batch, expected.shape[1])
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    for cache, expected_cache, old in zip(caches, expected_caches, before, strict=True):
        torch.testing.assert_close(cache, expected_cache)
        written = (cache != old).any(dim=(1, 2, 3)).nonzero().flatten()
        assert sorted(written.tolist()) == sorted(rows.tolist())  # each sequence's own block


def test_the_rank_runs_halves_on_one_rank_of_a_dense_model_only(runners, monkeypatch) -> None:
    from aioworker.compute import build_rank
    from aioworker.compute.build_rank import _decode_halves_from
    from aioworker.compute.parallel import SINGLE
    from aioworker.config import load_config

    _, whole, _ = runners
    config = load_config(overrides={"device.decode_halves_from": 128})
    assert _decode_halves_from(config, whole.model, SINGLE) == 128
    two_ranks = types.SimpleNamespace(size=2)
    assert _decode_halves_from(config, whole.model, two_ranks) == 0
    assert _decode_halves_from(load_config(), whole.model, SINGLE) == 0
    monkeypatch.setattr(build_rank, "expert_load_meter", lambda model: object())  # MoE layers
    assert _decode_halves_from(config, whole.model, SINGLE) == 0
