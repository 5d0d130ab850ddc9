"""Hand-made heartbeats, encoded as a rank publishes them: the watchers' tests send these."""

from __future__ import annotations

import time

from aioworker.wire.protocol import Heartbeat, encode


def beat_frames(
    state: str, *, rank: int = 0, pid: int = 1, interval_s: float = 0.05
) -> list[bytes]:
    """A beat of an idle rank in `state`, sent now."""
    return encode(
        Heartbeat(
            group=0,
            rank=rank,
            pid=pid,
            state=state,
            step_id=0,
            step_elapsed_s=0.0,
            num_running=0,
            num_waiting=0,
            kv_blocks_used=0,
            kv_blocks_total=8,
            tokens_per_s=0.0,
            weights_version=0,
            interval_s=interval_s,
            sent_at=time.time(),
        )  # fmt: skip
    )
