"""Automatic prefix caching: full KV blocks named by the tokens they hold, shared, and kept after use.

Every chat request to one assistant starts with the same system prompt, so the engine would compute
the same keys and values again for each. Instead, a *full* block is named by a hash chained over
its parent block's hash and its own token ids: two blocks get the same hash exactly when the whole
prefix up to and including them is the same, which is what makes their K/V equal (attention at a
position reads every token before it). A new request looks its leading full blocks up by hash and
shares the ones it finds (each block counts the block tables that hold it); it computes only from
the first block it did not find.

A block whose last holder finished keeps its K/V and its hash: it waits in an *evictable* pool, in
least-recently-used order, so the next request with that prefix reuses it; a block is taken from the
pool (and forgets its hash) only when a new block is needed and the free list is empty. The partly
filled last block of a sequence has no hash and is never shared, so a shared block is never written.

The hash is SHA-256 (`hashlib`), not Python's `hash()` of a tuple: a collision would hand one
request another's K/V and silently change its tokens (or leak one user's prompt into another's
answer), and 64 bits leave that to luck while 256 bits rule it out; the digest is also the same in
every process. It costs about a microsecond per block, nothing beside a forward pass.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

ROOT_HASH = b""                          # the parent of a sequence's first block


def hash_block(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    """The chained hash of one full block: SHA-256 of the parent's hash then the token ids (8 bytes each)."""
    digest = hashlib.sha256(parent_hash)
    digest.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return digest.digest()


def block_hashes(token_ids: Sequence[int], block_size: int, parent_hash: bytes = ROOT_HASH,
                 hash_fn=hash_block) -> list[bytes]:
    """Hashes of the full blocks of token_ids, each chained to the one before (a partial tail has none);
    `hash_fn` is `hash_block` unless a prefix-hash extension replaces it (`engine.plugins`)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash_fn(parent_hash, token_ids[start:start + block_size])
        hashes.append(parent_hash)
    return hashes


class PrefixCache:
    """Which blocks hold which hashed prefix, and the cached blocks nobody holds (evictable, LRU first).

    Counts what the engine reports under vLLM's names: `queries` (tokens looked up at admission)
    and `hits` (of those, tokens found in the cache and not computed again).
    """

    def __init__(self):
        self.block_of: dict[bytes, int] = {}        # chained hash -> the block holding that prefix
        self.hash_of: dict[int, bytes] = {}         # cached block -> its hash
        self.evictable: OrderedDict[int, None] = OrderedDict()   # cached blocks with no holder, oldest first
        self.queries = 0
        self.hits = 0

    def match(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks holding the longest run of leading hashes found in the cache."""
        found = []
        for h in hashes:
            block = self.block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def add(self, block: int, block_hash: bytes) -> None:
        """A block just filled: cache it under its hash, unless another block already holds that prefix
        (two requests computed it at once; the second copy stays private and is freed as usual)."""
        if block_hash not in self.block_of and block not in self.hash_of:
            self.block_of[block_hash] = block
            self.hash_of[block] = block_hash

    def park(self, block: int) -> bool:
        """A cached block lost its last holder: keep it, newest last in the LRU order. False if it is not cached."""
        if block not in self.hash_of:
            return False
        self.evictable[block] = None
        return True

    def take(self, block: int) -> None:
        """A request holds this cached block again: it is no longer evictable."""
        self.evictable.pop(block, None)

    def evict(self) -> int:
        """Reclaim the least recently used evictable block: it forgets its hash and becomes a new block."""
        block, _ = self.evictable.popitem(last=False)
        del self.block_of[self.hash_of.pop(block)]
        return block
