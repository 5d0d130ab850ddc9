"""`aioworker worker --rank R --config FILE`: run exactly one rank (what a systemd unit runs).

Ranks are numbered across the deployment: group = R // tensor_parallel_size, and the rank
inside its group is R % tensor_parallel_size (0 is the group's driver).
"""

from __future__ import annotations

import argparse

from aioworker.cli.common import add_config_arguments, config_from_args, fail, setup_logging
from aioworker.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rank", type=int, required=True, help="this process's rank in the deployment"
    )
    parser.add_argument(
        "--fake-executor",
        action="store_true",
        help="for tests and control-plane benchmarks: no model; every step returns at once with made-up tokens",
    )
    parser.add_argument(
        "--fake-step-ms",
        type=float,
        default=0.0,
        help="with --fake-executor: each step takes this long",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        help="with --fake-executor: steps from this id on raise an error",
    )
    parser.add_argument(
        "--fail-weights-phase",
        choices=["stage", "commit", "rollback", "release", "resume"],
        help="with --fake-executor: this weights phase raises an error",
    )
    parser.add_argument(
        "--fake-phase-ms",
        type=float,
        default=0.0,
        help="with --fake-executor: each weights phase takes this long",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from aioworker.wire.transport import group_endpoints

    try:
        config = config_from_args(args)
        tp = config.parallel.tensor_parallel_size
        dist_init = group_endpoints(config.runtime, args.rank // tp, tp).dist_init
    except ConfigError as exc:  # an unsafe runtime directory too
        return fail(str(exc))
    if not 0 <= args.rank < config.world_size:
        return fail(f"--rank {args.rank} is outside this deployment's {config.world_size} rank(s)")
    group, local_rank = divmod(args.rank, tp)
    from aioworker.wire.security import ServerSecurity

    try:
        security = ServerSecurity.from_config(config)  # a bad key file: a config error (exit 2)
    except ConfigError as exc:
        return fail(str(exc))
    setup_logging(config, f"{group}.{local_rank}", args.log_level)

    from aioworker.runtime.rank_main import run_rank
    from aioworker.wire.transport import EndpointInUseError, listen_for_rendezvous

    try:
        # Rank 0 serves the group's rendezvous on the group's host alone (torch would listen on
        # every interface); bound here, before the load, so a port in use fails at once.
        rendezvous_fd = listen_for_rendezvous(dist_init) if tp > 1 and local_rank == 0 else None
    except EndpointInUseError as exc:
        return fail(str(exc), 1)

    def build(report_phase):
        if args.fake_executor:
            from aioworker.core.fake_executor import build_fake

            return build_fake(
                config,
                fail_at_step=args.fail_at_step,
                step_seconds=args.fake_step_ms / 1000,
                fail_phase=args.fail_weights_phase,
                phase_seconds=args.fake_phase_ms / 1000,
            )
        from aioworker.compute.worker_process import build_rank  # noqa: I001 - before torch loads
        from aioworker.compute.parallel import (
            TensorParallel,  # torch enters here, on the load thread
        )

        return build_rank(
            config,
            TensorParallel(local_rank, tp),
            progress=False,
            dist_init=dist_init,
            rendezvous_listen_fd=rendezvous_fd,
            report_phase=report_phase,
            device_index=args.rank,
        )

    return run_rank(config, group, local_rank, build, security)
