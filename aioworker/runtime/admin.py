"""Admin commands on the driver: status, pause, resume, drain, abort, shutdown, set-log-level."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aioworker.runtime.state import RankState
from aioworker.wire.protocol import AdminReply, AdminRequest

if TYPE_CHECKING:
    from aioworker.runtime.driver import Driver

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


LONG_COMMANDS = frozenset({"update-weights", "release-memory", "resume-memory"})


async def handle_long(driver: Driver, request: AdminRequest, raw_frames: list[bytes]) -> AdminReply:
    """Weights and memory commands: they hold the group and may take minutes."""
    if driver.scheduler is None:
        return AdminReply(
            ok=False, message=f"worker is {driver.state.lower()}; try again when READY"
        )
    if request.command == "update-weights":
        return await driver.weights.update(request, raw_frames)
    if request.command == "release-memory":
        return await driver.weights.release(request)
    return await driver.weights.resume()


def handle(driver: Driver, request: AdminRequest) -> AdminReply:
    if request.command == "status":
        return AdminReply(ok=True, message=str(driver.state), data=status(driver))
    if request.command == "set-log-level":
        return set_log_level(request.argument)
    if driver.scheduler is None:
        return AdminReply(
            ok=False, message=f"worker is {driver.state.lower()}; try again when READY"
        )
    handler = _HANDLERS[request.command]
    return handler(driver, request.argument)


def status(driver: Driver) -> dict[str, Any]:
    running, waiting, used, total = driver.queue_depths()
    return {
        "group": driver.group,
        "state": str(driver.state),
        "detail": driver.detail,
        "step_id": driver.step_id,
        "num_running": running,
        "num_waiting": waiting,
        "kv_blocks_used": used,
        "kv_blocks_total": total,
        "num_requests": len(driver.requests),
        "num_tokens_generated": driver.num_tokens_generated,
        "num_rejected_frames": driver.rejected.total,
        "num_dropped_outputs": driver.results.drops.total,
        "loop_us_per_step": round(driver.loop_time.mean * 1e6, 1),
        "loop_cpu_us_per_step": round(driver.loop_cpu_time.mean * 1e6, 1),
        "weights_version": driver.weights_version,
        "last_weights_update_s": driver.weights.last_update_s,
        "tensor_parallel_size": driver.config.parallel.tensor_parallel_size,
        "model": str(driver.loaded.model_dir) if driver.loaded else None,
    }


def pause(driver: Driver, _: str) -> AdminReply:
    if driver.state is not RankState.READY:
        return AdminReply(ok=False, message=f"cannot pause: worker is {driver.state}")
    driver.state = RankState.PAUSED
    return AdminReply(ok=True, message="paused: running requests hold; new ones queue")


def resume(driver: Driver, _: str) -> AdminReply:
    if driver.state is not RankState.PAUSED:
        return AdminReply(ok=False, message=f"cannot resume: worker is {driver.state}, not PAUSED")
    driver.state = RankState.READY
    driver.work.set()
    return AdminReply(ok=True, message="resumed")


def drain(driver: Driver, argument: str) -> AdminReply:
    try:
        deadline = float(argument) if argument else driver.config.runtime.drain_timeout_s
    except ValueError:
        return AdminReply(
            ok=False, message=f"drain deadline {argument!r} is not a number of seconds"
        )
    in_flight = len(driver.requests)
    driver.start_drain(deadline)
    return AdminReply(ok=True, message=f"draining {in_flight} request(s); deadline {deadline:g}s")


def abort(driver: Driver, request_id: str) -> AdminReply:
    if driver.abort(request_id, "aborted by an operator"):
        return AdminReply(ok=True, message=f"aborted {request_id}")
    return AdminReply(ok=False, message=f"no request {request_id!r} in flight")


def shutdown(driver: Driver, _: str) -> AdminReply:
    count = driver.abort_all("worker shutting down")
    driver.stop()
    return AdminReply(ok=True, message=f"shutting down; aborted {count} request(s)")


def set_log_level(level: str) -> AdminReply:
    if level.upper() not in _LEVELS:
        return AdminReply(
            ok=False, message=f"log level {level!r} is not one of {', '.join(_LEVELS)}"
        )
    logging.getLogger().setLevel(level.upper())
    return AdminReply(ok=True, message=f"log level set to {level.upper()}")


_HANDLERS = {"pause": pause, "resume": resume, "drain": drain, "abort": abort, "shutdown": shutdown}
