"""The content address of a full KV block: a hash chained over its parent block's hash and its
own token ids, rooted in the cache's epoch (which changes whenever the weights or the cache's
memory do, so KV from other weights can never match). Torch-free.

A block's key holds its token ids exactly, so two blocks whose hashes collide never match; only
a collision of parent hashes (64 bits) could, a chance of about one in 2**64 per lookup."""

from __future__ import annotations

BlockKey = tuple[int, tuple[int, ...]]  # (parent block's hash, this block's token ids)


def root_hash(epoch: int) -> int:
    return hash(("aioworker-kv", epoch))


def block_key(parent_hash: int, token_ids: list[int]) -> BlockKey:
    return (parent_hash, tuple(token_ids))


def extend_hashes(
    hashes: list[int], token_ids: list[int], num_full_blocks: int, block_size: int, epoch: int
) -> list[BlockKey]:
    """Append to `hashes` the hashes of blocks len(hashes) .. num_full_blocks - 1 of `token_ids`;
    returns the keys of the blocks added."""
    keys = []
    parent = hashes[-1] if hashes else root_hash(epoch)
    for index in range(len(hashes), num_full_blocks):
        key = block_key(parent, token_ids[index * block_size : (index + 1) * block_size])
        parent = hash(key)
        hashes.append(parent)
        keys.append(key)
    return keys
