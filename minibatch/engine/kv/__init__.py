"""The KV cache: block bookkeeping (`BlockManager`) and the tensors themselves (`KVCache`)."""
from minibatch.engine.kv.block_manager import BlockManager, blocks_for
from minibatch.engine.kv.cache import KVCache, kv_bytes_per_token, pool_blocks

__all__ = ["BlockManager", "KVCache", "blocks_for", "kv_bytes_per_token", "pool_blocks"]
