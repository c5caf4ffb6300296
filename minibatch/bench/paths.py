"""The reference path against the fast one (`EngineConfig.kernels`): the same tokens, and each path's decode
step against this machine's memory bound.

A decode step reads every weight once, so it takes at least

    bytes of weights the step reads / memory bandwidth            (the memory bound)

whatever the batch. `compare_paths(prompts)` serves the same prompts greedily with an engine of each path,
at each batch size, in interleaved rounds (reference, fast, and this machine's copy bandwidth measured in
every round, so a busy moment hits all three alike). It returns the `Rounds` (each path's median decode
step at each batch size, in seconds; the copy bandwidth in GB/s) and one row per path and batch size: the
best round's step, the memory bound at the best bandwidth measured, how far the step is from it, and
whether the tokens equal the reference path's.
"""
from __future__ import annotations

import statistics

from minibatch.analysis.claims import Rounds, interleaved
from minibatch.bench.roofline import memory_bandwidth
from minibatch.config import EngineConfig, SamplingParams
from minibatch.llm import LLM

PATHS = ("reference", "fast")
BANDWIDTH = "copy bandwidth (GB/s)"


def step_name(path: str, batch: int) -> str:
    """The name of a path's figure in the Rounds: its median decode step at `batch` sequences."""
    return f"{path} decode step at batch {batch} (s)"


def compare_paths(prompts: list, batch_sizes=(1, 8), new_tokens: int = 12, rounds: int = 3,
                  model: str = "smollm2-135m") -> tuple[Rounds, list[dict]]:
    """Rounds and one row per (path, batch size) for `prompts` (at least max(batch_sizes) of them)."""
    llms = {path: LLM(EngineConfig(model=model, device="cpu", kernels=path, max_batch_size=max(batch_sizes)))
            for path in PATHS}                    # the fast path is the CPU's: both run there
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    tokens = {}

    def serve(path: str, batch: int) -> float:    # a batch served together; its median decode step
        llm = llms[path]
        first = len(llm.engine.step_records)
        tokens[path, batch] = [o.token_ids for o in llm.generate(prompts[:batch], params, use_tqdm=False)]
        steps = [s.duration for s in llm.engine.step_records[first:] if not s.num_prefill_tokens
                 and s.batch_size == batch]
        return statistics.median(steps) if steps else None

    for llm in llms.values():                     # warm-up: kernels compiled or loaded, threads started
        llm.generate(prompts[:max(batch_sizes)], SamplingParams(max_new_tokens=2), use_tqdm=False)
    figures = {step_name(p, b): (lambda p=p, b=b: serve(p, b)) for b in batch_sizes for p in PATHS}
    measured = interleaved({**figures, BANDWIDTH: lambda: memory_bandwidth(repeats=1) / 1e9}, rounds=rounds,
                           warmup=False)
    bandwidth = 1e9 * measured.most(BANDWIDTH)    # the best round: the machine undisturbed
    rows = []
    for batch in batch_sizes:
        for path in PATHS:
            weight_bytes = llms[path].engine.model.decode_weight_bytes()
            step, bound = measured.best(step_name(path, batch)), weight_bytes / bandwidth
            rows.append({"path": path, "batch": batch, "step_s": step, "bound_s": bound, "of_bound": bound / step,
                         "same_tokens": tokens[path, batch] == tokens["reference", batch]})
    return measured, rows


def table_lines(rows: list[dict]) -> list[str]:
    """The rows as a small table: step, bound, share of the bound, tokens."""
    lines = [f"{'path':>9} {'batch':>5} {'step ms':>8} {'bound ms':>8} {'of bound':>8}  tokens"]
    for r in rows:
        lines.append(f"{r['path']:>9} {r['batch']:>5} {1e3 * r['step_s']:8.1f} {1e3 * r['bound_s']:8.1f} "
                     f"{r['of_bound']:8.0%}  {'same as reference' if r['same_tokens'] else 'DIFFER'}")
    return lines
