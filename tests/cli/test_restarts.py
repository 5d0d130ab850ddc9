"""The launcher's restart bookkeeping: a backoff that doubles per recent restart up to its bound,
and a crash loop once max_restarts restarts fall within the window."""

from __future__ import annotations

import pytest

from aioworker.cli.restarts import RestartHistory, RestartPolicy
from aioworker.config import ConfigError, load_config

POLICY = RestartPolicy(backoff_s=1.0, max_backoff_s=5.0, max_restarts=4, window_s=100.0)


def test_the_backoff_doubles_up_to_its_bound_then_a_crash_loop() -> None:
    history, delays, now = RestartHistory(POLICY), [], 0.0
    while (delay := history.next_delay(now)) is not None:
        delays.append(delay)
        now += delay
        history.record(now)
    assert delays == [1.0, 2.0, 4.0, 5.0]
    assert history.num_recent(now) == 4


def test_restarts_older_than_the_window_no_longer_count() -> None:
    history = RestartHistory(POLICY)
    for now in (0.0, 1.0, 2.0, 3.0):
        history.record(now)
    assert history.next_delay(50.0) is None  # four within the window: a crash loop
    assert history.next_delay(101.5) == 4.0  # two have aged out
    assert history.next_delay(200.0) == 1.0


def test_no_restarts_at_all() -> None:
    assert RestartHistory(RestartPolicy(max_restarts=0)).next_delay(0.0) is None


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"launcher.restart_backoff_s": -1.0}, "launcher.restart_backoff_s"),
        ({"launcher.restart_backoff_s": 60.0}, "launcher.max_restart_backoff_s"),
        ({"launcher.max_restarts": -1}, "launcher.max_restarts"),
        ({"launcher.restart_window_s": 0.0}, "launcher.restart_window_s"),
    ],
)
def test_bad_launcher_options_are_named(overrides: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(overrides=overrides)


def test_the_policy_comes_from_the_config() -> None:
    options = load_config(overrides={"launcher.max_restarts": 2}).launcher
    assert RestartPolicy.from_options(options) == RestartPolicy(1.0, 30.0, 2, 300.0)
