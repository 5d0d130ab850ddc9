import pytest

from aioworker.core.speculation.policy import (
    PROBE_INTERVAL,
    SpeculationPolicy,
    expected_tokens,
)
from aioworker.core.speculation.step_costs import StepCosts


def measured(step_ms, max_tokens: int = 4) -> SpeculationPolicy:
    """A policy whose step costs are measured from `step_ms(num_tokens)` at 1..2048 tokens."""
    policy = SpeculationPolicy(max_tokens)
    for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 64, 128, 256, 512, 1024, 2048):
        policy.observe_step(n, step_ms(n) / 1e3)
    return policy


def weight_bound(n: int) -> float:
    """A small batch costs the weight read; past 64 tokens a step is bound by arithmetic."""
    return 30.0 + max(0.0, n - 64) * 1.0


def test_small_batches_speculate_and_large_ones_do_not() -> None:
    policy = measured(weight_bound)
    policy.acceptance, policy.proposal_rate = 0.8, 1.0
    assert policy.num_draft_tokens(1, 1) == 4
    assert policy.num_draft_tokens(256, 256) == 0
    assert 0 < policy.num_draft_tokens(32, 32) <= 4  # some drafts fit below the bend


def test_poor_acceptance_or_no_proposals_turn_speculation_off() -> None:
    policy = measured(lambda n: 30.0 + 3.0 * n)  # each token costs a tenth of a step
    policy.acceptance = 0.05
    assert policy.num_draft_tokens(1, 1) == 0
    policy.acceptance, policy.proposal_rate = 0.9, 0.0
    assert policy.num_draft_tokens(1, 1) == 0


def test_the_exposed_host_gap_counts_against_drafts() -> None:
    policy = measured(lambda n: 10.0 + 0.1 * n)
    policy.acceptance, policy.proposal_rate = 0.3, 1.0
    assert policy.num_draft_tokens(1, 1) > 0
    policy.observe_host_gap(0.02)  # twice a step: only near-certain drafts would pay
    policy.observe_host_gap(0.02)
    policy.host_gap_s = 0.02
    assert policy.num_draft_tokens(1, 1) == 0


def test_an_unmeasured_step_size_is_tried() -> None:
    policy = SpeculationPolicy(4)
    policy.observe_step(1, 0.03)
    assert policy.num_draft_tokens(1, 1) == 4  # 5 tokens were never measured
    policy.observe_step(5, 0.3)  # now it is, and it costs ten steps
    assert policy.num_draft_tokens(1, 1) < 4


def test_while_off_it_probes_once_per_interval() -> None:
    policy = measured(weight_bound)
    policy.proposal_rate = 0.0
    decisions = [policy.num_draft_tokens(1, 1, probe=True) for _ in range(3 * PROBE_INTERVAL)]
    assert decisions.count(4) == 3 and decisions.count(0) == 3 * PROBE_INTERVAL - 3
    assert not policy.probe_due
    # Where a verify step costs more than even perfect drafts give back, it never probes.
    costly = measured(lambda n: 30.0 * n)
    costly.proposal_rate = 0.0
    assert all(costly.num_draft_tokens(1, 1, probe=True) == 0 for _ in range(3 * PROBE_INTERVAL))


def test_a_large_batch_does_not_probe_on_a_size_between_measured_ones() -> None:
    """A step of 256 + 256 * 4 tokens was never run (few sequences ever get drafts), but steps
    of 256 and of 16,384 tokens were: it is interpolated, and costs far more than drafts give
    back. Taken as "never measured, try it", every interval would probe."""
    policy = SpeculationPolicy(4)
    policy.observe_step(256, 0.004)
    policy.observe_step(16384, 0.4)
    policy.proposal_rate = 0.0
    decisions = [policy.num_draft_tokens(256, 256, probe=True) for _ in range(3 * PROBE_INTERVAL)]
    assert decisions == [0] * (3 * PROBE_INTERVAL)


def test_without_dynamic_it_always_verifies_k() -> None:
    policy = measured(lambda n: 30.0 * n, max_tokens=3)
    policy.dynamic = False
    assert policy.num_draft_tokens(256, 256) == 3


def test_measured_rates_replace_the_priors() -> None:
    policy = SpeculationPolicy(4)
    for _ in range(100):
        policy.observe_verified(4, 1, 1)
        policy.observe_proposals(10, 5)
    assert policy.acceptance == pytest.approx(0.25, abs=0.01)
    assert policy.proposal_rate == pytest.approx(0.5, abs=0.01)
    assert (policy.num_proposed, policy.num_accepted, policy.num_verified) == (400, 100, 100)


def test_expected_tokens_per_step() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_step_costs_interpolate_between_measured_buckets() -> None:
    costs = StepCosts()
    assert costs.seconds(10) is None
    costs.observe(4, 0.010)
    costs.observe(16, 0.022)
    assert costs.seconds(10) == pytest.approx(0.016)
    assert costs.seconds(100) is None and costs.knows(5) and not costs.knows(100)
    assert costs.table() == [(4, 10.0), (16, 22.0)]


def test_no_k_takes_a_step_past_its_token_budget() -> None:
    policy = measured(lambda n: 30.0, max_tokens=4)  # drafts free: the largest k would win
    policy.max_step_tokens = 256
    assert policy.num_draft_tokens(1, 1) == 4
    assert policy.num_draft_tokens(64, 64) == 3  # 64 + 64 * 3 = 256
    assert policy.num_draft_tokens(256, 256) == 0
    policy.dynamic = False
    assert policy.num_draft_tokens(128, 128) == 1
