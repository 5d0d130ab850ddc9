"""How many CPU threads a rank's torch runs. Ranks that share a host split its cores: each
starting torch with every core would oversubscribe them (two ranks on two cores run four busy
threads) and starve the asyncio loops that share their processes."""

from __future__ import annotations

import os

from aioworker.config import RuntimeOptions, WorkerConfig


def num_threads_for_rank(
    config: WorkerConfig, global_rank: int | None, num_cores: int | None = None
) -> int:
    """device.num_threads when set; else, for rank `global_rank` of the deployment, its share of
    the cores this process may run on (at least 1); 0 (torch's default) for a process that is no
    deployment's rank, such as the offline engine."""
    if config.device.num_threads:
        return config.device.num_threads
    if global_rank is None:
        return 0
    if num_cores is None:
        num_cores = len(os.sched_getaffinity(0))
    return max(1, num_cores // num_ranks_on_host(config, global_rank))


def num_ranks_on_host(config: WorkerConfig, global_rank: int) -> int:
    """Ranks of the deployment on `global_rank`'s host: every rank under ipc (one host); under tcp,
    those whose address (runtime.rank_hosts, else runtime.host) equals this rank's."""
    runtime = config.runtime
    if runtime.transport == "ipc":
        return config.world_size
    host = _rank_host(runtime, global_rank)
    return sum(_rank_host(runtime, rank) == host for rank in range(config.world_size))


def _rank_host(runtime: RuntimeOptions, global_rank: int) -> str:
    # wire/transport.py's rank_host, which compute/ may not import: keep the two the same.
    hosts = runtime.rank_hosts
    return hosts[global_rank] if global_rank < len(hosts) and hosts[global_rank] else runtime.host
