"""The few-rows argmax (argmax_kernel.py) against torch.argmax: the same token for every row,
ties to the lowest id within a chunk and across chunks, a maximum in the ragged last chunk,
bf16 logits as they are; and the sampler's greedy steps take it where it applies. On a CPU
machine under Triton's interpreter; on the GPU machine for real."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.sampling import argmax_kernel  # noqa: E402
from aioworker.compute.sampling.argmax_kernel import CHUNK, argmax_rows, takes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 5 * CHUNK + 37  # a ragged last chunk


def test_every_row_gets_torchs_argmax() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, VOCAB, generator=g).round(decimals=1)  # many equal values
    for dtype in (torch.float32, torch.bfloat16):
        rows = logits.to(dtype).to(DEVICE)
        assert torch.equal(argmax_rows(rows).cpu(), rows.argmax(dim=-1).cpu())


@pytest.mark.parametrize(
    "places",
    [
        [3 * CHUNK + 5, CHUNK + 9, 4 * CHUNK],  # across chunks: the lowest chunk wins
        [2 * CHUNK + 700, 2 * CHUNK + 11],  # within a chunk: the lowest id
        [VOCAB - 1],  # alone in the ragged tail
        [0, VOCAB - 1],
    ],
)
def test_ties_go_to_the_lowest_token_id(places) -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, places] = 3.0
    logits[1, places[-1]] = 4.0  # row 1: the last place alone
    got = argmax_rows(logits.to(DEVICE)).cpu().tolist()
    assert got == [min(places), places[-1]] == logits.argmax(dim=-1).tolist()


def test_nan_is_above_everything_as_torch_has_it_and_every_id_is_a_token() -> None:
    """A broken model's NaN logits: the first NaN's id, as torch's argmax gives. A row of NaN
    only once got an id past the vocabulary, which the next step's embedding lookup failed on."""
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1))
    logits[0, [4 * CHUNK + 3, CHUNK + 8]] = float("nan")  # across chunks
    logits[1, [VOCAB - 1]] = float("nan")  # in the ragged tail
    logits[1, 7] = float("inf")
    logits[2] = float("nan")
    logits[3] = float("-inf")
    logits[4, [2 * CHUNK + 600, 2 * CHUNK + 5]] = float("nan")  # within a chunk
    for dtype in (torch.float32, torch.bfloat16):
        got = argmax_rows(logits.to(dtype).to(DEVICE)).cpu().tolist()
        assert got == [CHUNK + 8, VOCAB - 1, 0, 0, 2 * CHUNK + 5]
        assert got == logits.to(dtype).argmax(dim=-1).tolist()


def test_it_takes_a_few_long_contiguous_rows_only() -> None:
    assert takes(torch.empty(16, VOCAB)) and not takes(torch.empty(17, VOCAB))
    assert not takes(torch.empty(1, 4 * CHUNK - 1)) and not takes(torch.empty(VOCAB, 2).t())
    with pytest.raises(ValueError, match="use torch.argmax"):
        argmax_rows(torch.empty(17, VOCAB))


def test_greedy_steps_take_the_kernel_and_others_keep_torch(monkeypatch) -> None:
    from aioworker.compute.sampling.sampler import Sampler, SampleRow
    from aioworker.core.plan import SamplingSettings

    calls = []
    real = argmax_kernel.argmax_rows
    monkeypatch.setattr(argmax_kernel, "argmax_rows", lambda x: calls.append(x.dtype) or real(x))
    sampler = Sampler(0, torch.device(DEVICE), one_pass=True)
    logits = torch.randn(2, VOCAB, dtype=torch.bfloat16, device=DEVICE)
    greedy = SamplingSettings(0.0, 0, 1.0, None, 0, [])
    rows = [SampleRow(greedy, 4, 0), SampleRow(greedy, 9, 3)]
    assert torch.equal(sampler(logits, rows).cpu(), logits.argmax(dim=-1).cpu())
    assert calls == [torch.bfloat16]  # the logits as the head made them: no float32 pass
    assert torch.equal(sampler(logits[:, :100], rows).cpu(), logits[:, :100].argmax(-1).cpu())
    assert calls == [torch.bfloat16]  # too short a row: torch's


def test_warm_up_compiles_the_argmax_for_float32_and_the_models_dtype(monkeypatch) -> None:
    from aioworker.compute.sampling.sampler import Sampler

    compiled = []
    real = argmax_kernel.argmax_rows
    monkeypatch.setattr(argmax_kernel, "argmax_rows", lambda x: compiled.append(x.dtype) or real(x))
    Sampler(0, torch.device(DEVICE), one_pass=True).warm_up(VOCAB, torch.bfloat16)
    assert compiled == [torch.float32, torch.bfloat16]
    Sampler(0, torch.device(DEVICE), one_pass=True).warm_up(100, torch.bfloat16)  # torch's rows
    assert compiled == [torch.float32, torch.bfloat16]
