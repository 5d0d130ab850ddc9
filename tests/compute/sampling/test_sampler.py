"""The sampler, each test on both of its draws: torch with a generator per seeded row, and the
one-pass Triton kernel (in Triton's interpreter on a CPU machine)."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.sampling.sampler import Sampler, SampleRow, derive_seed
from aioworker.core.plan import SamplingSettings
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams

CPU = torch.device("cpu")


@pytest.fixture(params=[False, True], ids=["torch", "one-pass"])
def make_sampler(request):
    """Sampler(seed) as a function of CPU logits; the one-pass kernel runs on CUDA where there
    is a GPU, else in Triton's interpreter."""
    if not request.param:
        return lambda seed: Sampler(seed, CPU)
    pytest.importorskip("triton")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def on_device(seed: int):
        sampler = Sampler(seed, device, one_pass=True)
        return lambda logits, rows: sampler(logits.to(device), rows).cpu()

    return on_device


def settings(
    temperature=1.0, top_k=0, top_p=1.0, seed=None, min_tokens=0, stop=()
) -> SamplingSettings:
    return SamplingSettings(temperature, top_k, top_p, seed, min_tokens, list(stop))


def rows(
    *settings_list: SamplingSettings, position: int = 10, num_outputs: int = 5
) -> list[SampleRow]:
    return [SampleRow(s, position, num_outputs) for s in settings_list]


def random_logits(num_rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_takes_the_argmax(make_sampler) -> None:
    logits = random_logits(3)
    out = make_sampler(0)(logits, rows(settings(0.0), settings(0.0), settings(0.0)))
    assert out.tolist() == logits.argmax(-1).tolist()


def test_top_k_one_and_tiny_top_p_are_greedy(make_sampler) -> None:
    logits = random_logits(4)
    out = make_sampler(0)(
        logits,
        rows(settings(top_k=1), settings(top_k=1), settings(top_p=1e-6), settings(top_p=1e-6)),
    )
    assert out.tolist() == logits.argmax(-1).tolist()


def test_top_k_never_leaves_the_k_likeliest(make_sampler) -> None:
    logits = random_logits(1, vocab=100).repeat(400, 1)
    out = make_sampler(1)(logits, rows(*[settings(temperature=5.0, top_k=3)] * 400))
    allowed = set(logits[0].topk(3).indices.tolist())
    assert set(out.tolist()) <= allowed and len(set(out.tolist())) == 3


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(make_sampler) -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log().repeat(500, 1)
    out = make_sampler(2)(logits, rows(*[settings(top_p=0.7)] * 500))
    assert set(out.tolist()) == {0, 1}  # 0.5 < 0.7 needs the second token; the third is cut


def test_sampling_follows_the_distribution(make_sampler) -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().repeat(1500, 1)  # Triton's interpreter takes ~5 ms a row
    out = make_sampler(3)(logits, rows(*[settings()] * 1500))
    frequencies = torch.bincount(out, minlength=3).float() / 1500
    assert torch.allclose(frequencies, probs, atol=0.05)  # 4 standard deviations


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch(make_sampler) -> None:
    logits = random_logits(5)
    seeded = settings(temperature=1.0, seed=1234)
    alone = [make_sampler(s)(logits[2:3], rows(seeded)).item() for s in range(3)]
    in_batch = make_sampler(99)(
        logits, rows(settings(), settings(0.0), seeded, settings(top_k=5), settings())
    )[2].item()
    assert alone == [alone[0]] * 3 and in_batch == alone[0]


def test_seeded_draws_differ_by_position(make_sampler) -> None:
    logits = torch.zeros(1, 1000)
    draws = {make_sampler(0)(logits, rows(settings(seed=5), position=p)).item() for p in range(20)}
    assert len(draws) > 10
    assert derive_seed(5, 1) != derive_seed(5, 2) and 0 <= derive_seed(2**62, 7) < 2**63


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", 0, "max_tokens is 0"),
        ("temperature", -0.5, "temperature is -0.5"),
        ("temperature", float("nan"), "temperature is nan"),
        ("top_p", 0.0, "top_p is 0.0"),
        ("top_p", 1.5, "top_p is 1.5"),
        ("top_k", -1, "top_k is -1"),
        ("min_tokens", 50, "min_tokens is 50"),
    ],
)
def test_invalid_params_name_the_field(field: str, value, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**{field: value}).validate()


def test_warm_up_runs_the_one_pass_draw_and_nothing_else() -> None:
    """The rank's WARMING phase compiles the kernel; a torch sampler has nothing to warm."""
    pytest.importorskip("triton")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    Sampler(0, device, one_pass=True).warm_up(300)
    Sampler(0, CPU, one_pass=False).warm_up(300)
