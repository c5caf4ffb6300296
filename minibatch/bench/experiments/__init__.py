"""Experiments: the measurements behind docs/performance.md, one question each, runnable on their own.

    python -m minibatch.bench.experiments.products paths | formats | rates | blocks
        which product path wins at each row count, what each weight format reads, and which bound holds
        (blocks: the quantised products with the weight in cache and from memory)
    python -m minibatch.bench.experiments.layers steps | parts | compile
        whole compiled layers against part by part, the fused small parts against torch, torch.compile
    python -m minibatch.bench.experiments.attention
        the Numba paged attention against the torch reference, prefill and decode
    python -m minibatch.bench.experiments.threads
        a server that follows the free cores against one with fixed threads, a core taken after it started
    python -m minibatch.bench.experiments.instructions
        one core's multiply-adds per second by float32 vectors, AVX512-BF16's pairs and AMX's tiles
    python -m minibatch.bench.experiments.phases
        where a run of the bench's workload spends its time: prefill steps against decode steps

Each runs its arms interleaved (A B A B ...), so the machine's noise hits all of them alike, prints the
medians and the largest difference between the arms' outputs, and asserts nothing about time: the
figures are this machine's, at this hour. Run them at the thread count to compare, for example
`OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 python -m minibatch.bench.experiments.products paths`. They call
the engine through its public entry points only (`tests/test_kernel_docs.py` checks the imports), and
`python -m minibatch bench` stays the comparison against other engines.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

PRODUCTS = ("qkv", "o", "gate_up", "down")    # a layer's products, its projections fused as the model fuses them
FUSED = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
         "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def milliseconds(run: Callable[[], object]) -> float:
    """Wall-clock milliseconds of one call of run()."""
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def interleaved(arms: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """The median milliseconds of each arm over `reps` rounds, every arm once per round (after one warm-up
    call each: compilation, first touch of memory)."""
    if reps < 1:
        raise ValueError(f"reps={reps} is not allowed: at least 1 round")
    for run in arms.values():
        run()
    times = {name: [] for name in arms}
    for _ in range(reps):
        for name, run in arms.items():
            times[name].append(milliseconds(run))
    return {name: statistics.median(t) for name, t in times.items()}


def fused_weights(state_dict: dict[str, torch.Tensor], num_layers: int, dtype: torch.dtype) -> list[dict]:
    """Each layer's weights as the model fuses them, {"qkv": (3 ..., C), "o", "gate_up", "down"}, in `dtype`."""
    return [{name: torch.cat([state_dict[f"model.layers.{i}.{part}.weight"] for part in parts]).to(dtype).contiguous()
             for name, parts in FUSED.items()} for i in range(num_layers)]


def check_positive(parser, name: str, values) -> None:
    """Refuse a row count, batch size or repetition count below 1, naming the flag and the value."""
    if min(values) < 1:
        parser.error(f"--{name} {' '.join(map(str, values))}: every value must be at least 1")


def threads_line() -> str:
    """The thread counts the figures were taken at (torch's pool; Numba's follows the engine's choice)."""
    import numba
    return f"{torch.get_num_threads()} torch threads, {numba.get_num_threads()} Numba threads"
