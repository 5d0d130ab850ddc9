"""The KV connector seam: how KV blocks move between the device cache and somewhere else (a host
memory tier now; another server's cache for prefill/decode roles later). Torch-free.

It has two halves, joined only by the step plan and its result:

Scheduler half (`KvConnector`, here, on the engine core's thread):
    match()        - at admission, after the device prefix cache: how many more of a waiting
                     sequence's tokens the connector can supply, and from where.
    load()         - after the scheduler gave the sequence device blocks: queue the copy into
                     them; the sequence waits, holding its blocks, until the copy is reported.
    save_cached()  - the cached free blocks next in line for eviction, while empty blocks run
                     short: queue copies out of those the connector lacks; the block manager
                     holds each (never reused, still a prefix hit) until the copy is reported.
    swap_out()     - a running sequence is preempted: queue a copy of its KV, or say no (it is
                     then recomputed); its blocks are held until the copy is reported.
    forget()       - a sequence ended, or started without what the connector kept for it.
    take_copies()  - once per plan: the copies queued since the last one (`KvTransfers`).
    finished()     - once per result: the copies a rank reported done or failed (`KvReport`).
    observe_step() - a step's tokens and seconds: the cost of recomputing, for swap decisions.
    reset()        - new weights, released memory or an operator's reset: nothing kept serves.

Worker half (`compute/kv_transfer.py`, on every rank's executor thread):
    issue()        - before a plan's forward: order the forward after the copies the driver saw
                     finish, then start this plan's copies on a copy stream.
    report()       - with a step's result: copies done or failed since the last report.

A copy is named by a transfer id. Every rank runs the same copies on its own shard of each block
(tensor parallelism), and only the driver's reports reach the scheduler: a plan lists the ids
the driver saw finish, and every rank orders that plan's forward after its own copies of them.
Nothing here names a transport: a connector to another server fits the same hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from aioworker.core.block_hashes import BlockKey

if TYPE_CHECKING:
    from aioworker.core.sequence import Sequence


class KvCopy(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """Device blocks paired with the other tier's blocks, in order."""

    transfer_id: int
    device_block_ids: list[int]
    tier_block_ids: list[int]


class KvTransfers(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A plan's copies. Saves run before loads, in the order given, on one stream per rank."""

    saves: list[KvCopy] = []
    loads: list[KvCopy] = []
    # Copies the driver saw finish since the last plan: this plan may read or reuse their
    # blocks, so every rank orders its forward after its own copies of them.
    completed: list[int] = []


class KvReport(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A rank's copies that ended since its last report, and what they moved."""

    done: list[int] = []
    failed: list[int] = []
    bytes_saved: int = 0
    bytes_loaded: int = 0
    seconds_saving: float = 0.0
    seconds_loading: float = 0.0
    error: str = ""  # the first failure's cause


@dataclass(frozen=True, slots=True)
class Saving:
    """What `save_cached` does with the blocks it was given: copies some out (one transfer),
    already holds others; the rest it has no room for."""

    transfer_id: int | None
    copied: list[int]
    present: list[int]


@dataclass(frozen=True, slots=True)
class ExternalMatch:
    """What `match` found: `num_tokens` more tokens past the device's, and where they are."""

    num_tokens: int
    source: Any


class KvConnector(Protocol):
    @property
    def writes_back(self) -> bool:
        """Whether `save_cached` wants to hear of blocks next to be evicted at all."""
        ...

    def match(
        self, seq: Sequence, num_device_tokens: int, keys_after: list[BlockKey]
    ) -> ExternalMatch | None:
        """`keys_after`: the content addresses of the sequence's full blocks past the device
        hits (empty where prefix caching is off)."""
        ...

    def load(self, seq: Sequence, match: ExternalMatch, block_ids: list[int]) -> int:
        """Queue the copy of `match` into `block_ids` (the blocks after the device hits);
        returns its transfer id."""
        ...

    def save_cached(self, blocks: list[tuple[int, BlockKey]]) -> Saving:
        """`blocks`: (block id, content address), next to be evicted first."""
        ...

    def swap_out(self, seq: Sequence) -> int | None:
        """A transfer id if the sequence's KV is copied out, None to recompute it."""
        ...

    def forget(self, seq: Sequence) -> None: ...

    def take_copies(self) -> tuple[list[KvCopy], list[KvCopy]]:
        """(saves, loads) queued since the last call."""
        ...

    def finished(self, report: KvReport) -> list[int]:
        """Take a report; returns the sequence ids whose KV was lost with a failed copy."""
        ...

    def observe_step(self, num_tokens: int, seconds: float) -> None: ...

    def reset(self) -> int:
        """Drop everything kept; returns how many blocks of the other tier that was."""
        ...

    def stats(self) -> dict[str, int | float]: ...


class NoKvConnector:
    """The default: nothing beyond the device cache, so scheduling is exactly what it was."""

    writes_back = False

    def match(self, seq, num_device_tokens, keys_after) -> None:
        return None

    def load(self, seq, match, block_ids) -> int:
        raise AssertionError("NoKvConnector matches nothing, so it never loads")

    def save_cached(self, blocks) -> Saving:
        return Saving(None, [], [])

    def swap_out(self, seq) -> None:
        return None

    def forget(self, seq) -> None:
        pass

    def take_copies(self) -> tuple[list[KvCopy], list[KvCopy]]:
        return [], []

    def finished(self, report: KvReport) -> list[int]:
        return []

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        pass

    def reset(self) -> int:
        return 0

    def stats(self) -> dict[str, int | float]:
        return {}
