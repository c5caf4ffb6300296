"""The block manager: which KV blocks are free and which blocks each request owns.

The cache is cut into blocks of `block_size` tokens. A request's *block table* lists the blocks
holding its tokens in order, so token p lives in block `table[p // block_size]` at offset
`p % block_size`. Blocks come from a free list and go back to it when the request finishes or is
preempted. Nothing here touches tensors: this is bookkeeping the scheduler consults.

Two layouts share this code. "paged" allocates a block only when a token needs it, so a request
wastes at most the unused tail of its last block. "contiguous" reserves room for `max_model_len`
tokens the moment a request is admitted, as engines did before paging; the unused part of that
reservation is the waste the memory chapter measures.
"""
from __future__ import annotations

from collections import deque

import numpy as np


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens tokens (ceil division)."""
    return -(-num_tokens // block_size)


class BlockManager:
    """A free list of KV blocks and a block table per request id."""

    def __init__(self, num_blocks: int, block_size: int, layout: str = "paged", max_model_len: int = 0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout = layout
        self.max_model_len = max_model_len
        self.reserve_blocks = blocks_for(max_model_len, block_size) if layout == "contiguous" else 0
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self.tokens_stored: dict[int, int] = {}   # tokens each request has asked room for

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, request_id: int, num_tokens: int) -> int:
        """How many more blocks request_id needs to hold num_tokens tokens in total."""
        target = blocks_for(num_tokens, self.block_size)
        if self.layout == "contiguous":
            target = max(target, self.reserve_blocks)
        return max(0, target - len(self.block_tables.get(request_id, ())))

    def can_allocate(self, request_id: int, num_tokens: int) -> bool:
        return self.blocks_needed(request_id, num_tokens) <= len(self.free_blocks)

    def allocate(self, request_id: int, num_tokens: int) -> list[int]:
        """Grow request_id's block table so it holds num_tokens tokens; returns the table."""
        needed = self.blocks_needed(request_id, num_tokens)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"out of KV blocks: need {needed}, {len(self.free_blocks)} free")
        table = self.block_tables.setdefault(request_id, [])
        table.extend(self.free_blocks.popleft() for _ in range(needed))
        self.tokens_stored[request_id] = max(self.tokens_stored.get(request_id, 0), num_tokens)
        return table

    def shrink(self, request_id: int, num_tokens: int) -> None:
        """Keep only the blocks that hold request_id's first num_tokens tokens; the rest go back to the
        free list (speculative decoding reserves room for draft tokens, then rewinds past the rejected)."""
        table = self.block_tables.get(request_id)
        if table is None:
            return
        keep = blocks_for(num_tokens, self.block_size)
        if self.layout == "contiguous":
            keep = max(keep, self.reserve_blocks)
        self.free_blocks.extend(table[keep:])
        del table[keep:]
        self.tokens_stored[request_id] = min(self.tokens_stored[request_id], num_tokens)

    def free(self, request_id: int) -> None:
        """Return every block of request_id to the free list."""
        self.free_blocks.extend(self.block_tables.pop(request_id, ()))
        self.tokens_stored.pop(request_id, None)

    def slot(self, request_id: int, position: int) -> int:
        """Flat cache slot of token `position` of request_id."""
        table = self.block_tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, request_id: int, positions: np.ndarray) -> np.ndarray:
        """`slot` for an array of positions (the runner's and the draft's slot mapping)."""
        table = np.asarray(self.block_tables[request_id])
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def usage(self) -> dict:
        """Tokens stored, blocks reserved and the internal waste, right now."""
        reserved_tokens = self.num_used_blocks * self.block_size
        stored = sum(self.tokens_stored.values())
        return {
            "blocks_used": self.num_used_blocks,
            "blocks_total": self.num_blocks,
            "tokens_stored": stored,
            "tokens_reserved": reserved_tokens,
            "waste_fraction": (reserved_tokens - stored) / reserved_tokens if reserved_tokens else 0.0,
        }
