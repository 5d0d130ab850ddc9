"""The KV connector's worker half (core/kv_connector.py has both halves' hooks): every rank's
runner hands it a plan's copies before the forward, and adds its report to the step's result.
The default has no other tier and never copies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import msgspec

from aioworker.core.kv_connector import KvReport, KvTransfers
from aioworker.core.plan import StepResult

if TYPE_CHECKING:
    from aioworker.compute.step.stages import StepHandle


class KvCopier(Protocol):
    @property
    def is_idle(self) -> bool:
        """Nothing in flight and nothing left to report: results need no report."""
        ...

    def issue(self, transfers: KvTransfers) -> None:
        """On the executor thread, before the plan's forward: order the forward after the
        copies in `transfers.completed`, then start the plan's saves and loads."""
        ...

    def report(self, wait: bool) -> KvReport | None:
        """Copies that ended since the last report (`wait`: all of them, waiting as needed)."""
        ...

    def wait_all(self) -> None:
        """Block until no copy is in flight (before the KV cache's memory is released)."""
        ...


class NoKvCopies:
    is_idle = True

    def issue(self, transfers: KvTransfers) -> None:
        raise RuntimeError("a plan carries KV copies but this rank has no other KV tier")

    def report(self, wait: bool) -> None:
        return None

    def wait_all(self) -> None:
        pass


class WithKvReport:
    """A step's handle whose result carries the copier's report; a plan with no sequences waits
    for every copy in flight, so a scheduler with nothing else to run still hears of them."""

    def __init__(self, step: StepHandle, copier: KvCopier, wait: bool) -> None:
        self._step, self._copier, self._wait = step, copier, wait

    def result(self) -> StepResult:
        result = self._step.result()
        report = self._copier.report(self._wait)
        return result if report is None else msgspec.structs.replace(result, kv=report)
