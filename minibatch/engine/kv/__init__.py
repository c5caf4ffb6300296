"""The KV cache: block bookkeeping (`BlockManager`), the prefix cache, and the tensors themselves (`KVCache`)."""
from minibatch.engine.kv.block_manager import BlockManager, blocks_for
from minibatch.engine.kv.cache import KVCache, kv_bytes_per_token, pool_blocks
from minibatch.engine.kv.prefix_cache import PrefixCache, block_hashes, hash_block

__all__ = ["BlockManager", "KVCache", "PrefixCache", "block_hashes", "blocks_for", "hash_block",
           "kv_bytes_per_token", "pool_blocks"]
