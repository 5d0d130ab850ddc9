"""Each rank's share of its host's CPU cores, and the OpenMP wait policy of worker processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aioworker.compute.cpu_threads import num_ranks_on_host, num_threads_for_rank
from aioworker.config import load_config


def config(**overrides):
    return load_config(overrides=overrides)


def test_under_ipc_every_rank_of_the_deployment_shares_the_host() -> None:
    four_ranks = config(**{"parallel.tensor_parallel_size": 2, "parallel.data_parallel_size": 2})
    assert num_ranks_on_host(four_ranks, 3) == 4
    assert num_threads_for_rank(four_ranks, 3, num_cores=16) == 4
    assert num_threads_for_rank(four_ranks, 0, num_cores=2) == 1  # never fewer than one


def test_under_tcp_only_the_ranks_of_the_same_host_share_it() -> None:
    spread = config(
        **{
            "parallel.tensor_parallel_size": 2,
            "parallel.data_parallel_size": 2,
            "runtime.transport": "tcp",
            "runtime.host": "10.0.0.1",
            "runtime.rank_hosts": ["10.0.0.1", "10.0.0.1", "", "10.0.0.2"],  # "": runtime.host
        }
    )
    assert [num_ranks_on_host(spread, rank) for rank in range(4)] == [3, 3, 3, 1]
    assert num_threads_for_rank(spread, 0, num_cores=12) == 4
    assert num_threads_for_rank(spread, 3, num_cores=12) == 12
    one_host = config(**{"parallel.data_parallel_size": 3, "runtime.transport": "tcp"})
    assert num_threads_for_rank(one_host, 2, num_cores=12) == 4


def test_device_num_threads_overrides_the_share() -> None:
    explicit = config(**{"parallel.data_parallel_size": 2, "device.num_threads": 3})
    assert num_threads_for_rank(explicit, 1, num_cores=16) == 3
    assert num_threads_for_rank(explicit, None, num_cores=16) == 3


def test_a_process_that_is_no_rank_keeps_torch_default() -> None:
    assert num_threads_for_rank(config(**{"parallel.data_parallel_size": 2}), None) == 0


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ({}, "/10000"),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE/"),
        ({"GOMP_SPINCOUNT": "1000"}, "/1000"),
    ],
)
def test_a_worker_process_spins_briefly_unless_told(preset, expected) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    probe = (
        "import os, aioworker.compute.worker_process; "
        "print(os.environ.get('OMP_WAIT_POLICY', '') + '/' + os.environ.get('GOMP_SPINCOUNT', ''))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], env={**env, **preset}, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
