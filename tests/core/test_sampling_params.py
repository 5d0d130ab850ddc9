"""What a request may ask for: a bad value is refused naming the field and its limit; a
temperature too small to divide by samples greedily."""

from __future__ import annotations

import math

import msgspec
import pytest

from aioworker.core.block_manager import BlockManager
from aioworker.core.sampling_params import GREEDY_BELOW, InvalidRequestError, SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence


@pytest.mark.parametrize("temperature", [math.inf, -math.inf, math.nan, -0.5])
def test_a_temperature_that_is_not_finite_and_non_negative_is_refused(temperature) -> None:
    with pytest.raises(InvalidRequestError, match="temperature is .*; it must be finite and >= 0"):
        SamplingParams(temperature=temperature).validate()


def test_unknown_fields_are_refused_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `max_token`"):
        msgspec.convert({"max_token": 5}, SamplingParams)


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, GREEDY_BELOW / 2])
def test_a_temperature_below_the_bound_is_scheduled_as_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    params.validate()
    scheduler = Scheduler(BlockManager(4, 4), 4, 64, 16)
    scheduler.add(Sequence(0, "r", [1, 2], params))
    [new_seq] = scheduler.schedule().new_seqs
    assert params.is_greedy and new_seq.sampling.temperature == 0.0


def test_a_temperature_at_the_bound_is_sampled_as_asked() -> None:
    scheduler = Scheduler(BlockManager(4, 4), 4, 64, 16)
    scheduler.add(Sequence(0, "r", [1, 2], SamplingParams(temperature=GREEDY_BELOW)))
    [new_seq] = scheduler.schedule().new_seqs
    assert new_seq.sampling.temperature == GREEDY_BELOW
