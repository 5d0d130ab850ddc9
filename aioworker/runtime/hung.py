"""A step that stops making progress is a fatal fault: dump every thread's stack to the log (to
see where it hangs), then fail the rank with ExitCode.HUNG so the supervisor restarts it."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import sys
import time

from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.progress import StepProgress
from aioworker.runtime.state import ExitCode

log = logging.getLogger(__name__)


async def watch_for_hung_steps(progress: StepProgress) -> None:
    """Raises FatalError(HUNG) when the oldest step in flight is older than the timeout."""
    timeout_s = progress.hung_step_timeout_s
    if timeout_s <= 0:
        return
    while True:
        await asyncio.sleep(min(timeout_s / 4, 1.0))
        started = progress.started_at
        if started is None or time.monotonic() - started <= timeout_s:
            continue
        age = time.monotonic() - started
        log.critical(
            "step %d has run for %.1fs; stacks of every thread follow", progress.step_id, age
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise FatalError(
            ExitCode.HUNG,
            f"step {progress.step_id} made no progress for {age:.1f}s "
            f"(runtime.hung_step_timeout_s = {timeout_s:g})",
        )
