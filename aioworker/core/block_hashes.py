"""The content address of a full KV block: a keyed BLAKE2b digest chained over its parent
block's digest and its own token ids, rooted in the cache's epoch (which changes whenever the
weights or the cache's memory do, so KV from other weights can never match). Torch-free.

The digest is cryptographic and keyed with a secret drawn when the block manager is made, so no
client can craft two prefixes whose chains collide and be served another request's KV (the
class of vLLM's CVE-2025-25183, where chains were built with Python's `hash()`, which is
neither keyed nor randomised for integers). A block's key also holds its token ids exactly."""

from __future__ import annotations

import hashlib
import os
from array import array

DIGEST_BYTES = 32

BlockKey = tuple[bytes, tuple[int, ...]]  # (parent block's digest, this block's token ids)


class BlockHasher:
    """Chains block digests under one secret key (one per block manager: only it compares
    them)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = os.urandom(DIGEST_BYTES) if key is None else key

    def root(self, epoch: int) -> bytes:
        return self._digest(b"aioworker-kv-root", epoch.to_bytes(8, "little", signed=True))

    def extend(
        self,
        hashes: list[bytes],
        token_ids: list[int],
        num_full_blocks: int,
        block_size: int,
        epoch: int,
    ) -> list[BlockKey]:
        """Append to `hashes` the digests of blocks len(hashes) .. num_full_blocks - 1 of
        `token_ids`; returns the keys of the blocks added."""
        keys = []
        if len(hashes) >= num_full_blocks:
            return keys  # most calls: no block has filled since the last one
        parent = hashes[-1] if hashes else self.root(epoch)
        for index in range(len(hashes), num_full_blocks):
            block = token_ids[index * block_size : (index + 1) * block_size]
            keys.append((parent, tuple(block)))
            # Fixed-width ids: no two token lists give the same bytes.
            parent = self._digest(parent, array("q", block).tobytes())
            hashes.append(parent)
        return keys

    def _digest(self, parent: bytes, data: bytes) -> bytes:
        hasher = hashlib.blake2b(parent, digest_size=DIGEST_BYTES, key=self._key)
        hasher.update(data)
        return hasher.digest()
