"""Chapter 07 (prefix caching): the chained block hashes of a prompt, and the tokens a new request finds cached."""

from minibatch.checks.core import Case, check_cases, checker, same_value


def _hash_block(parent_hash, token_ids):
    from minibatch.engine.kv import hash_block
    return hash_block(parent_hash, token_ids)


# The usual wrong turns, each with what to think about instead.
def _full_blocks(t, bs):
    return [t[i:i + bs] for i in range(0, len(t) - bs + 1, bs)]


MISTAKES = {
    "hashes each block alone": lambda t, bs: [_hash_block(b"", block) for block in _full_blocks(t, bs)],
    "hashes the partly filled last block too": lambda t, bs: _chain([t[i:i + bs] for i in range(0, len(t), bs)]),
    "chains every block to the first one": lambda t, bs: _chain_to_first(_full_blocks(t, bs)),
}
ADVICE = {
    "hashes each block alone": "a block's keys and values depend on every token before it, so its hash must "
    "include its parent's hash (the parent of the first block is b\"\")",
    "hashes the partly filled last block too": "only full blocks are hashed: the last, partly filled block will "
    "still be written, so it is never shared",
    "chains every block to the first one": "each block's parent is the block just before it, so the hash names "
    "the whole prefix up to and including the block",
}


def _chain(blocks):
    hashes, parent = [], b""
    for block in blocks:
        parent = _hash_block(parent, block)
        hashes.append(parent)
    return hashes


def _chain_to_first(blocks):
    if not blocks:
        return []
    first = _hash_block(b"", blocks[0])
    return [first] + [_hash_block(first, block) for block in blocks[1:]]


PROMPTS = [(list(range(100, 150)), 16), (list(range(100, 140)), 16), (list(range(100, 132)), 16), ([7] * 10, 4),
           ([1, 2, 3], 4), ([], 2), (list(range(50, 59)), 1), ([5, 6, 7, 8, 5, 6, 7, 8], 4)]


def _engine_hashes(token_ids, block_size):
    """The hashes the engine's BlockManager gives a request's full blocks once they are computed."""
    from minibatch.engine.kv import BlockManager

    blocks = BlockManager(len(token_ids) // block_size + 1, block_size, enable_prefix_caching=True)
    blocks.allocate(0, len(token_ids))
    blocks.cache_full_blocks(0, token_ids, len(token_ids))
    return list(blocks.hashes.get(0, []))


def _engine_cached_tokens(cached_prompt, token_ids, block_size):
    """Tokens of token_ids the engine finds in a cache that holds cached_prompt's full blocks."""
    from minibatch.engine.kv import BlockManager

    blocks = BlockManager(64, block_size, enable_prefix_caching=True)
    blocks.allocate(0, len(cached_prompt))
    blocks.cache_full_blocks(0, cached_prompt, len(cached_prompt))
    blocks.free(0)
    return len(blocks.cached_prefix(token_ids)) * block_size, set(blocks.prefix_cache.block_of)


@checker("block_hashes(token_ids, block_size) and cached_tokens(token_ids, block_size, cached)", debug=True)
def check_prefix_hits(block_hashes, cached_tokens):
    """Debugging exercise: hashes against the engine's BlockManager; cached tokens against its lookup, on a cache
    holding one prompt."""
    tokens, size = PROMPTS[0]
    got = block_hashes(tokens, size)
    for mistake, wrong in MISTAKES.items():
        if same_value(got, wrong(tokens, size)) and not same_value(got, _engine_hashes(tokens, size)):
            raise AssertionError(f"on {len(tokens)} tokens in blocks of {size}, your block_hashes {mistake}: "
                                 f"{ADVICE[mistake]}")
    n = check_cases(block_hashes, [Case((t, bs), _engine_hashes(t, bs)) for t, bs in PROMPTS])
    system = list(range(200, 248))                                       # 48 tokens: three blocks of 16
    cases = []
    for request in (system + [1, 2, 3], system, system[:40] + [9] * 20, [9] + system, system + system, system[:16]):
        expected, cached = _engine_cached_tokens(system + [4, 5], request, 16)
        cases.append(Case((request, 16, cached), expected))
    full = next(c for c in cases if c.args[0] == system)
    if cached_tokens(*full.args) == len(system):
        raise AssertionError("a prompt whose every block is cached must still compute its last token (the step "
                             "that computes it samples the first output token): look up token_ids[:-1]")
    for case in cases:
        got = cached_tokens(*case.args)
        if case.expected and got == case.expected // 16:
            raise AssertionError(f"on a prompt whose first {case.expected} tokens are cached you answered {got}: that "
                                 "is the number of blocks found; the request skips that many blocks of 16 tokens")
        if got != case.expected and got == len(_engine_hashes(case.args[0][:-1], 16)) * 16 and len(case.args[0]) > 16:
            raise AssertionError(f"on a prompt of {len(case.args[0])} tokens you answered {got}, every full block, but "
                                 f"only its first {case.expected} tokens are in the cache: reuse stops at the first "
                                 "block whose hash the cache does not hold")
    return n + check_cases(cached_tokens, cases)
