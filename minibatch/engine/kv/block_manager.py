"""The block manager: which KV blocks are free and which blocks each request owns.

The cache is cut into blocks of `block_size` tokens. A request's *block table* lists the blocks
holding its tokens in order, so token p lives in block `table[p // block_size]` at offset
`p % block_size`. Blocks come from a free list and go back to it when the request finishes or is
preempted. Nothing here touches tensors: this is bookkeeping the scheduler consults.

Two layouts share this code. "paged" allocates a block only when a token needs it, so a request
wastes at most the unused tail of its last block. "contiguous" reserves room for `max_model_len`
tokens the moment a request is admitted, as engines did before paging; the unused part of that
reservation is the waste the memory chapter measures.

With prefix caching (`enable_prefix_caching=True`, paged only) a full block can sit in several
tables at once: each block counts the tables holding it, and a cached block nobody holds waits in
the prefix cache's evictable pool instead of the free list (`minibatch.engine.kv.prefix_cache`).
Blocks are then free (no K/V worth keeping), cached (K/V kept, nobody holds them) or used.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from minibatch.engine.kv.prefix_cache import PrefixCache, block_hashes, hash_block


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens tokens (ceil division)."""
    return -(-num_tokens // block_size)


class BlockManager:
    """A free list of KV blocks, a block table per request id and, optionally, the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, layout: str = "paged", max_model_len: int = 0,
                 enable_prefix_caching: bool = False, hash_fn=hash_block):
        if enable_prefix_caching and layout != "paged":
            raise ValueError(f"prefix caching needs the paged layout, not layout={layout!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout = layout
        self.max_model_len = max_model_len
        self.reserve_blocks = blocks_for(max_model_len, block_size) if layout == "contiguous" else 0
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self.tokens_stored: dict[int, int] = {}   # tokens each request has asked room for
        self.ref_counts: dict[int, int] = {}       # held block -> how many block tables hold it
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        self.hashes: dict[int, list[bytes]] = {}   # request id -> chained hashes of its full, computed blocks
        self.hash_fn = hash_fn                      # hash_fn(parent_hash, block_token_ids): names a full block

    @property
    def num_cached_blocks(self) -> int:
        """Blocks no request holds whose K/V the prefix cache keeps for reuse (evictable)."""
        return len(self.prefix_cache.evictable) if self.prefix_cache else 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can be given now: the free list plus the evictable cached blocks."""
        return len(self.free_blocks) + self.num_cached_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """The cached blocks holding token_ids' leading full blocks ([] without prefix caching). The last
        token is always left to compute, so the step that computes it samples the next one."""
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.match(block_hashes(token_ids[:len(token_ids) - 1], self.block_size,
                                                    hash_fn=self.hash_fn))

    def blocks_needed(self, request_id: int, num_tokens: int, prefix: Sequence[int] = ()) -> int:
        """Blocks request_id must take from the free or evictable ones to hold num_tokens tokens in total;
        a new request starting with the cached `prefix` takes those of them that nobody holds."""
        held = len(self.block_tables.get(request_id, prefix))
        return max(0, self._table_length(num_tokens) - held) + sum(1 for b in prefix if b not in self.ref_counts)

    def _table_length(self, num_tokens: int) -> int:
        """Blocks a table holding num_tokens tokens has (a contiguous one: its whole reservation)."""
        return max(blocks_for(num_tokens, self.block_size), self.reserve_blocks)

    def can_allocate(self, request_id: int, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        return self.blocks_needed(request_id, num_tokens, prefix) <= self.num_free_blocks

    def allocate(self, request_id: int, num_tokens: int, prefix: Sequence[int] = ()) -> list[int]:
        """Grow request_id's block table so it holds num_tokens tokens; returns the table. A new request
        given a cached `prefix` (from `cached_prefix`) starts its table with those shared blocks."""
        needed = self.blocks_needed(request_id, num_tokens, prefix)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {needed}, {self.num_free_blocks} free")
        if request_id not in self.block_tables and prefix:
            self._share(request_id, prefix)
        table = self.block_tables.setdefault(request_id, [])
        for _ in range(self._table_length(num_tokens) - len(table)):
            block = self.free_blocks.popleft() if self.free_blocks else self.prefix_cache.evict()
            self.ref_counts[block] = 1
            table.append(block)
        self.tokens_stored[request_id] = max(self.tokens_stored.get(request_id, 0), num_tokens)
        return table

    def _share(self, request_id: int, prefix: Sequence[int]) -> None:
        """Start request_id's table with cached blocks, counting the lookup (vLLM's queries and hits, in tokens)."""
        for block in prefix:
            self.prefix_cache.take(block)
            self.ref_counts[block] = self.ref_counts.get(block, 0) + 1
        self.block_tables[request_id] = list(prefix)
        self.hashes[request_id] = [self.prefix_cache.hash_of[b] for b in prefix]

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (vLLM's reset_prefix_cache): cached blocks become free. Only when
        no request holds a block, so a benchmark's next run starts cold."""
        if self.prefix_cache is None:
            return
        if self.block_tables:
            raise RuntimeError(f"reset_prefix_cache with {len(self.block_tables)} requests holding blocks")
        self.free_blocks.extend(self.prefix_cache.evictable)
        self.prefix_cache.block_of.clear()
        self.prefix_cache.hash_of.clear()
        self.prefix_cache.evictable.clear()

    def record_lookup(self, num_tokens: int, num_cached_tokens: int) -> None:
        """Count one admission's lookup: num_tokens asked for, num_cached_tokens found (no-op without caching)."""
        if self.prefix_cache is not None:
            self.prefix_cache.queries += num_tokens
            self.prefix_cache.hits += num_cached_tokens

    def cache_full_blocks(self, request_id: int, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Hash and cache request_id's blocks that are now full of computed tokens (in prefill or decode)."""
        if self.prefix_cache is None or request_id not in self.block_tables:
            return
        hashes = self.hashes.setdefault(request_id, [])
        table = self.block_tables[request_id]
        for index in range(len(hashes), num_computed_tokens // self.block_size):
            parent = hashes[-1] if hashes else b""
            hashes.append(self.hash_fn(parent, token_ids[index * self.block_size:(index + 1) * self.block_size]))
            self.prefix_cache.add(table[index], hashes[-1])

    def _release(self, blocks: list[int]) -> None:
        """Drop one hold on each block; a block nobody holds goes back to the free list, or, if cached,
        to the evictable pool (tail blocks first, so a sequence's shared head is evicted last)."""
        for block in blocks if self.prefix_cache is None else reversed(blocks):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                del self.ref_counts[block]
                if self.prefix_cache is None or not self.prefix_cache.park(block):
                    self.free_blocks.append(block)

    def shrink(self, request_id: int, num_tokens: int) -> None:
        """Keep only the blocks that hold request_id's first num_tokens tokens; the rest go back to the
        free list (speculative decoding reserves room for draft tokens, then rewinds past the rejected)."""
        table = self.block_tables.get(request_id)
        if table is None:
            return
        keep = self._table_length(num_tokens)
        self._release(table[keep:])
        del table[keep:]
        del self.hashes.get(request_id, [])[num_tokens // self.block_size:]
        self.tokens_stored[request_id] = min(self.tokens_stored[request_id], num_tokens)

    def free(self, request_id: int) -> None:
        """Let go of every block of request_id: to the free list, or kept in the prefix cache."""
        self._release(self.block_tables.pop(request_id, []))
        self.tokens_stored.pop(request_id, None)
        self.hashes.pop(request_id, None)

    def slot(self, request_id: int, position: int) -> int:
        """Flat cache slot of token `position` of request_id."""
        table = self.block_tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, request_id: int, positions: np.ndarray) -> np.ndarray:
        """`slot` for an array of positions (the runner's and the draft's slot mapping)."""
        table = np.asarray(self.block_tables[request_id])
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    @property
    def num_tokens_stored(self) -> int:
        """Tokens the held blocks store, a shared block's counted once."""
        shared_copies = sum(self.ref_counts.values()) - len(self.ref_counts)
        return sum(self.tokens_stored.values()) - shared_copies * self.block_size

    def usage(self) -> dict:
        """Tokens stored, blocks reserved and the internal waste, right now."""
        reserved_tokens = self.num_used_blocks * self.block_size
        stored = self.num_tokens_stored
        return {
            "blocks_used": self.num_used_blocks,
            "blocks_total": self.num_blocks,
            "tokens_stored": stored,
            "tokens_reserved": reserved_tokens,
            "waste_fraction": (reserved_tokens - stored) / reserved_tokens if reserved_tokens else 0.0,
        }
