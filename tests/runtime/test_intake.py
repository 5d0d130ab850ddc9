"""The intake aborts a request only for the key it came with."""

from __future__ import annotations

import logging

from aioworker.runtime.intake import RequestIntake
from aioworker.wire.drops import DropCounter


class Requests:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def client_of(self, request_id: str):
        return ("tcp://10.0.0.5:7000", "alice-key") if request_id == "r" else None

    def abort(self, request_id: str, reason: str) -> bool:
        self.aborted.append(request_id)
        return True


def test_only_the_key_a_request_came_with_may_abort_it() -> None:
    intake = RequestIntake.__new__(RequestIntake)
    intake.requests = Requests()
    intake.rejected = DropCounter(logging.getLogger("t"), "frames")
    intake.on_abort("r", "mallory-key")
    assert intake.requests.aborted == [] and intake.rejected.total == 1
    intake.on_abort("r", "alice-key")
    assert intake.requests.aborted == ["r"]
