"""The host KV tier's worker half (a KvCopier, compute/kv_transfer.py): a pool of host blocks
and the copies between it and the device's KV cache.

A host block ("slot") holds one device block of every layer, K then V, as raw bytes, so one
block of any cache dtype and layout moves as one contiguous run. On a GPU the pool is pinned and
copies run on a stream of their own: a save gathers its device blocks into a staging buffer and
copies each block out with one transfer, a load does the reverse. The copy stream first waits
for the steps already queued (they may still write the blocks saved, or read the blocks loaded
into), and a plan's forward waits only for the copies the driver saw finish, so copies overlap
the steps in between. On the CPU the pool is a second tensor and copies are done when issued.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aioworker.compute.small_copies import to_device
from aioworker.core.kv_connector import KvCopy, KvReport, KvTransfers

# Device memory for gathering the blocks of one copy (a copy of more blocks runs in parts): each
# part costs the executor thread one gather per layer's K and V, so parts are large.
STAGING_BYTES = 256 << 20


class HostKvAllocationError(RuntimeError):
    pass


@dataclass
class _InFlight:
    is_save: bool
    num_bytes: int
    # The GPU: events around the copy on its stream. The CPU: done when issued, in `seconds`.
    started: torch.cuda.Event | None
    ended: torch.cuda.Event | None
    seconds: float = 0.0

    def has_ended(self) -> bool:
        return self.ended is None or self.ended.query()

    def duration(self) -> float:
        if self.ended is None:
            return self.seconds
        self.ended.synchronize()
        return self.started.elapsed_time(self.ended) / 1e3


def _runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """(first row, first slot, count) of each run of consecutive slots: one transfer each, the
    bytes of a run being contiguous in the pool and in staging."""
    runs = []
    for row, slot in enumerate(slots):
        if runs and slot == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([row, slot, 1])
    return [tuple(run) for run in runs]


def kv_block_bytes(kv_layers: list, block_dim: int) -> int:
    """One block's bytes in every layer's K and V cache (this rank's shard)."""
    return sum(
        _bytes_per_block(cache, block_dim)
        for layer in kv_layers
        for cache in (layer.k_cache, layer.v_cache)
    )


def _bytes_per_block(cache: torch.Tensor, block_dim: int) -> int:
    return cache.numel() * cache.element_size() // cache.shape[block_dim]


def allocate_host_pool(num_slots: int, slot_bytes: int, pin: bool) -> torch.Tensor:
    try:
        return torch.empty((num_slots, slot_bytes), dtype=torch.uint8, pin_memory=pin)
    except RuntimeError as exc:
        size = num_slots * slot_bytes
        raise HostKvAllocationError(
            f"cache.host_kv_bytes: could not reserve {size / 2**30:.2f} GiB of "
            f"{'pinned ' if pin else ''}host memory for {num_slots} KV blocks ({exc}); "
            "lower cache.host_kv_bytes, or set it to 0 to turn the host tier off"
        ) from exc


class HostKvCopies:
    def __init__(
        self,
        kv_layers: Callable[[], list],
        num_slots: int,
        device: torch.device,
        block_dim: int = 0,
    ) -> None:
        """`kv_layers`: the layers whose `k_cache` / `v_cache` hold the device blocks (read per
        copy: a memory release and resume replaces the tensors); `block_dim`: the cache
        tensors' block dimension (0, or 1 where heads come first)."""
        self._kv_layers = kv_layers
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.block_dim = block_dim
        self.block_bytes = kv_block_bytes(kv_layers(), block_dim)
        self.pool = allocate_host_pool(num_slots, self.block_bytes, pin=self.on_gpu)
        self._staging = None
        self._stream = None
        if self.on_gpu:
            rows = max(1, min(num_slots, STAGING_BYTES // self.block_bytes))
            self._staging = torch.empty((rows, self.block_bytes), dtype=torch.uint8, device=device)
            self._stream = torch.cuda.Stream(device)
        self._in_flight: dict[int, _InFlight] = {}
        self._failed: list[int] = []
        self._error = ""
        self._lock = threading.Lock()  # issue() on the executor thread, report() on another
        # Tests: copies fail while set, as a broken device or host would make them.
        self.fail_copies = False

    # -- KvCopier -----------------------------------------------------------------------------

    @property
    def is_idle(self) -> bool:
        return not (self._in_flight or self._failed)

    def issue(self, transfers: KvTransfers) -> None:
        if self.on_gpu:
            self._order_forward_after(transfers.completed)
            # The steps queued so far may write the blocks saved or read those loaded into.
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        for copy in transfers.saves:
            self._run(copy, is_save=True)
        for copy in transfers.loads:
            self._run(copy, is_save=False)

    def report(self, wait: bool) -> KvReport | None:
        with self._lock:
            ended = [tid for tid, copy in self._in_flight.items() if wait or copy.has_ended()]
            if not (ended or self._failed):
                return None
            copies = [self._in_flight.pop(transfer_id) for transfer_id in ended]
            failed, self._failed = self._failed, []
            error, self._error = self._error, ""
        saves = [copy for copy in copies if copy.is_save]
        loads = [copy for copy in copies if not copy.is_save]
        return KvReport(
            ended,
            failed,
            bytes_saved=sum(copy.num_bytes for copy in saves),
            bytes_loaded=sum(copy.num_bytes for copy in loads),
            seconds_saving=sum(copy.duration() for copy in saves),
            seconds_loading=sum(copy.duration() for copy in loads),
            error=error,
        )

    def wait_all(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    # -- copies -------------------------------------------------------------------------------

    def _caches(self) -> list[torch.Tensor]:
        return [cache for layer in self._kv_layers() for cache in (layer.k_cache, layer.v_cache)]

    def _run(self, copy: KvCopy, is_save: bool) -> None:
        num_bytes = len(copy.device_block_ids) * self.block_bytes
        try:
            if self.fail_copies:
                raise RuntimeError("copies fail (fail_copies is set)")
            if self.on_gpu:
                record = _InFlight(is_save, num_bytes, *self._copy_on_gpu(copy, is_save))
            else:
                started = time.perf_counter()
                self._copy_on_cpu(copy, is_save)
                record = _InFlight(is_save, num_bytes, None, None, time.perf_counter() - started)
        except Exception as exc:  # the scheduler ends the requests that needed it
            with self._lock:
                self._failed.append(copy.transfer_id)
                self._error = self._error or f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self._in_flight[copy.transfer_id] = record

    def _copy_on_cpu(self, copy: KvCopy, is_save: bool) -> None:
        blocks = torch.tensor(copy.device_block_ids)
        slots = torch.tensor(copy.tier_block_ids)
        if is_save:
            rows = torch.empty((len(blocks), self.block_bytes), dtype=torch.uint8)
            self._copy(is_save, rows, blocks)
            self.pool[slots] = rows
        else:
            self._copy(is_save, self.pool[slots], blocks)

    def _copy_on_gpu(self, copy: KvCopy, is_save: bool) -> tuple[torch.cuda.Event, ...]:
        started = torch.cuda.Event(enable_timing=True)
        ended = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            started.record()
            num_rows = self._staging.shape[0]
            for first in range(0, len(copy.device_block_ids), num_rows):
                block_ids = copy.device_block_ids[first : first + num_rows]
                slots = copy.tier_block_ids[first : first + num_rows]
                # Pinned: a pageable copy would make this thread wait for the steps queued.
                blocks = to_device(self.device, block_ids, torch.long)
                rows = self._staging[: len(block_ids)]
                if not is_save:
                    for row, slot, count in _runs(slots):
                        rows[row : row + count].copy_(self.pool[slot : slot + count], True)
                self._copy(is_save, rows, blocks)
                if is_save:
                    for row, slot, count in _runs(slots):
                        self.pool[slot : slot + count].copy_(rows[row : row + count], True)
            ended.record()
        return started, ended

    def _copy(self, is_save: bool, rows: torch.Tensor, blocks: torch.Tensor) -> None:
        """Between the device blocks `blocks` and `rows` ([len(blocks), block_bytes])."""
        offset = 0
        for cache in self._caches():
            span = slice(offset, offset + self._bytes_per_block(cache))
            if is_save:
                rows[:, span] = self._gather(cache, blocks)
            else:
                self._scatter(cache, blocks, rows[:, span])
            offset = span.stop

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """[len(blocks), bytes of a block] from `cache`."""
        picked = self._by_block(cache).index_select(self.block_dim, blocks)
        if self.block_dim == 1:  # [heads, n, bytes] -> [n, heads, bytes]
            picked = picked.transpose(0, 1)
        return picked.reshape(len(blocks), -1)

    def _scatter(self, cache: torch.Tensor, blocks: torch.Tensor, rows: torch.Tensor) -> None:
        flat = self._by_block(cache)
        if self.block_dim == 1:  # [n, heads * bytes] -> [heads, n, bytes]
            rows = rows.reshape(len(blocks), flat.shape[0], -1).transpose(0, 1)
        flat.index_copy_(self.block_dim, blocks, rows)

    def _by_block(self, cache: torch.Tensor) -> torch.Tensor:
        """A byte view: [num_blocks, bytes], or [heads, num_blocks, bytes] where heads lead."""
        lead = cache.shape[: self.block_dim + 1]
        return cache.view(*lead, -1).view(torch.uint8)

    def _bytes_per_block(self, cache: torch.Tensor) -> int:
        return _bytes_per_block(cache, self.block_dim)

    def _order_forward_after(self, transfer_ids: list[int]) -> None:
        """This plan reads or reuses the blocks of these copies: its forward waits for them."""
        compute = torch.cuda.current_stream(self.device)
        with self._lock:
            for transfer_id in transfer_ids:
                copy = self._in_flight.get(transfer_id)
                if copy is not None and copy.ended is not None:
                    compute.wait_event(copy.ended)
