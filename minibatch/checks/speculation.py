"""Chapter 10 (edge mode and speculative decoding): expected speed-up and greedy verification."""

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


@checker("expected_tokens_per_step(a, k) and speedup(a, k, step_cost)")
def check_speculation_speedup(expected_tokens_per_step, speedup):
    """Tokens per step 1 + a + ... + a^k, and the chapter's rule: speed-up = tokens per step / step cost,
    the step cost being a speculative step's time (drafting and verifying) over a plain step's."""
    from minibatch.engine.speculative import expected_tokens_per_step as reference

    grid = [(a, k) for a in (0.0, 0.3, 0.6, 0.9, 1.0) for k in (1, 3, 6)]
    n = check_cases(expected_tokens_per_step, [Case((a, k), reference(a, k)) for a, k in grid])
    costs = [(a, k, c) for a, k in grid[::2] for c in (1.0, 1.3, 2.0)]
    return n + check_cases(speedup, [Case((a, k, c), reference(a, k) / c) for a, k, c in costs])


@checker("verify_greedy(draft_token_ids, target_token_ids)")
def check_verify_greedy(verify_greedy):
    """Keep drafts while they equal the model's argmax, then add the model's own token: against the engine's rule."""
    from minibatch.engine.speculative import verify_greedy as reference

    hand = [([4, 5, 6], [4, 5, 6, 7]), ([4, 5, 6], [4, 9, 6, 7]), ([4, 5, 6], [8, 5, 6, 7]), ([], [3]),
            ([2, 2], [2, 3, 2])]
    rng = np.random.default_rng(9)
    for _ in range(12):
        k = int(rng.integers(1, 6))
        target = [int(t) for t in rng.integers(0, 5, size=k + 1)]
        keep = int(rng.integers(0, k + 1))
        drafts = target[:keep] + [int(t) for t in rng.integers(0, 5, size=k - keep)]
        hand.append((drafts, target))
    return check_cases(verify_greedy, [Case((list(d), list(t)), reference(d, t)) for d, t in hand])
