"""Chapter 09 (small-model specifics): the overhead share of a step and the batch size that amortises it."""

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


@checker("overhead_share(parts)")
def check_overhead_share(overhead_share):
    """The share of a step outside the model's arithmetic, against the profiler's own answer."""
    from minibatch.analysis.profiler import MODEL_PARTS, PARTS
    from minibatch.analysis.profiler import overhead_share as reference

    rng = np.random.default_rng(8)
    profiles = [{p: float(t) for p, t in zip(PARTS, rng.exponential(1e-3, len(PARTS)))} for _ in range(6)]
    model_only = {p: (1e-3 if p in MODEL_PARTS else 0.0) for p in PARTS}
    overhead_only = {p: (0.0 if p in MODEL_PARTS or p == "propose" else 2e-3) for p in PARTS}
    profiles += [model_only, overhead_only, {**model_only, "propose": 5e-3, "sample": 1e-3}]
    return check_cases(overhead_share, [Case((p,), reference(p)) for p in profiles])


def _smallest_batch(fixed_s, per_seq_s, target_share):
    batch = 1
    while fixed_s / (fixed_s + batch * per_seq_s) > target_share:
        batch += 1
    return batch


@checker("batch_for_fixed_share(fixed_s, per_seq_s, target_share)")
def check_batch_for_fixed_share(batch_for_fixed_share):
    """Smallest batch size whose step spends at most target_share on the fixed per-step cost."""
    cases = [(0.021, 0.001, 0.5), (0.02, 0.0015, 0.45), (0.002, 0.004, 0.9), (0.002, 0.004, 0.3),
             (0.035, 0.0009, 0.25), (0.8, 0.003, 0.05), (0.01, 0.01, 0.999)]   # none on an exact boundary
    return check_cases(batch_for_fixed_share, [Case(c, _smallest_batch(*c)) for c in cases])
