"""Chapter 06 (the KV cache and memory): predict, from a model's config, the KV bytes of one long context and
the largest batch of such contexts a KV budget admits; the checker measures both with the engine's own objects."""

import torch

from minibatch.checks.core import checker

# (name, the config's fields): real shapes, one of them a model whose head_dim is not hidden_size / heads
SHAPES = {
    "SmolLM2-135M": dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30,
                         head_dim=64),
    "Llama-3-8B": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32,
                       head_dim=128),
    "Gemma-2-2B": dict(hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=26,
                       head_dim=256),
    "Llama-2-7B": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32,
                       head_dim=128),
}
SITUATIONS = [  # (model, bytes per element, context tokens, KV budget in bytes, block size)
    ("SmolLM2-135M", 2, 4096, 1 << 30, 16), ("SmolLM2-135M", 4, 4096, 1 << 30, 16),
    ("SmolLM2-135M", 2, 1000, 256 << 20, 16), ("Llama-3-8B", 2, 4096, 16 << 30, 16),
    ("Gemma-2-2B", 2, 4096, 4 << 30, 32), ("Llama-2-7B", 2, 4096, 16 << 30, 16), ("SmolLM2-135M", 2, 100, 5 << 20, 64),
]
DTYPES = {4: torch.float32, 2: torch.bfloat16}


def model_config(name):
    """A transformers LlamaConfig with the named model's attention shape."""
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPES[name], intermediate_size=4 * SHAPES[name]["hidden_size"], vocab_size=1000)


def measured(config, bytes_per_element, context_tokens, budget_bytes, block_size):
    """(bytes the engine's paged cache holds for one sequence of context_tokens, sequences the budget admits): a
    KVCache of that sequence's blocks on the meta device (sizes, no memory), and a BlockManager filled up."""
    from minibatch.engine.kv import BlockManager, blocks_for
    from minibatch.engine.kv.cache import KVCache, pool_blocks

    dtype = DTYPES[bytes_per_element]
    shape = (config.num_hidden_layers, blocks_for(context_tokens, block_size), block_size,
             config.num_key_value_heads, config.head_dim)
    one = KVCache(*shape, dtype, "meta")
    pool = pool_blocks(None, budget_bytes, block_size, one.bytes_per_token, context_tokens, 1 << 20)
    blocks, count = BlockManager(pool, block_size), 0
    while blocks.can_allocate(count, context_tokens):
        blocks.allocate(count, context_tokens)
        count += 1
    return one.total_bytes, count


def _per_token(c, size, heads, layers=None, factor=2, head_dim=None):
    return factor * (c.num_hidden_layers if layers is None else layers) * heads * (head_dim or c.head_dim) * size


def _blocks(tokens, bs):
    return -(-tokens // bs) * bs


# The usual wrong turns: (config, bytes, context, budget, block size) -> (context bytes, batch), and what to look at.
MISTAKES = {
    "counts the query heads": (
        lambda c, s, n, b, bs: _per_token(c, s, c.num_attention_heads) * _blocks(n, bs),
        "the cache holds K and V for the KV heads only (num_key_value_heads); with grouped-query attention several "
        "query heads read the same KV head"),
    "counts the keys but not the values": (
        lambda c, s, n, b, bs: _per_token(c, s, c.num_key_value_heads, factor=1) * _blocks(n, bs),
        "every token stores a key AND a value vector per KV head"),
    "counts one layer": (
        lambda c, s, n, b, bs: _per_token(c, s, c.num_key_value_heads, layers=1) * _blocks(n, bs),
        "every layer keeps its own keys and values for every token"),
    "takes head_dim as hidden_size / num_attention_heads": (
        lambda c, s, n, b, bs: _per_token(c, s, c.num_key_value_heads,
                                          head_dim=c.hidden_size // c.num_attention_heads) * _blocks(n, bs),
        "read config.head_dim: not every model has hidden_size = heads x head_dim"),
    "counts the context's tokens, not its whole blocks": (
        lambda c, s, n, b, bs: _per_token(c, s, c.num_key_value_heads) * n,
        "the paged cache hands out whole blocks of block_size tokens; a partly filled last block is reserved "
        "all the same"),
}


@checker("predict_kv(config, bytes_per_element, context_tokens, budget_bytes, block_size)")
def check_kv_prediction(predict_kv):
    """Each prediction against the engine's KVCache and BlockManager: exact (these are counts)."""
    for name, size, tokens, budget, block_size in SITUATIONS:
        config = model_config(name)
        args = (config, size, tokens, budget, block_size)
        got = predict_kv(*args)
        want = measured(*args)
        call = f"{name}, {size} bytes per element, {tokens} tokens, a budget of {budget / 2**20:g} MiB, blocks of " \
               f"{block_size}"
        assert isinstance(got, (tuple, list)) and len(got) == 2, \
            f"predict_kv must return (context_bytes, max_batch), got {got!r}"
        if got[0] != want[0]:
            named = [f"your prediction {m}: {why}" for m, (wrong, why) in MISTAKES.items() if got[0] == wrong(*args)]
            raise AssertionError(f"{call}: you predicted {got[0]:,} bytes for one sequence, the engine's cache holds "
                                 f"{want[0]:,}." + (f" Y{named[0][1:]}" if named else ""))
        if got[1] != want[1]:
            hint = ("the budget is cut into blocks first, and each sequence needs whole blocks of its own"
                    if got[1] == budget // (_per_token(config, size, config.num_key_value_heads) * tokens) else
                    "fill the budget with sequences of this context until the next one's blocks do not fit")
            raise AssertionError(f"{call}: you predicted a batch of {got[1]}, the engine's BlockManager admits "
                                 f"{want[1]}: {hint}")
    smol = measured(model_config("SmolLM2-135M"), 2, 4096, 1 << 30, 16)
    print(f"Measured with the engine's KVCache and BlockManager: a 4,096-token context of SmolLM2-135M in bfloat16 "
          f"holds {smol[0] / 2**20:.1f} MiB of keys and values, and a 1 GiB budget admits {smol[1]} of them at once. "
          "Your predictions match exactly: the cache is 2 (K and V) x layers x KV heads x head_dim x bytes per "
          "element per token, in whole blocks. A weight-light model with few KV heads is cheap per token; what "
          "caps the batch is the context length times the number of sequences, not the weights.")
    return len(SITUATIONS)
