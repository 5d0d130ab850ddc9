"""Where a step's grammar masks wait for its sampling: the thread that provides them puts them
in, and the executor thread takes them at the logits stage (core/grammar.py)."""

from __future__ import annotations

import threading

from aioworker.compute.step.logits import RefusedTokens

# A step waits this long for its masks before it fails: the engine core fills them as soon as
# the step before completes, so a longer wait means that engine core is gone.
MASK_TIMEOUT_S = 300.0


class MasksNeverCame(RuntimeError):
    """A step's masks did not come: the executor is stopping, or the engine core is gone."""


class MaskMailbox:
    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._masks: dict[int, RefusedTokens] = {}
        self._closed = False

    def put(self, masks: RefusedTokens) -> None:
        with self._ready:
            self._masks[masks.step_id] = masks
            self._ready.notify_all()

    def take(self, step_id: int, timeout: float = MASK_TIMEOUT_S) -> RefusedTokens:
        with self._ready:
            if (
                not self._ready.wait_for(lambda: step_id in self._masks or self._closed, timeout)
                or step_id not in self._masks
            ):
                raise MasksNeverCame(f"the grammar masks of step {step_id} never came")
            return self._masks.pop(step_id)

    def close(self) -> None:
        """Release a waiting step (the executor stops)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
