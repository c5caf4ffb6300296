"""The batching timeout on the real engine: requests arriving on the wall clock, served with several timeouts.

With continuous batching an engine that is busy admits a new request at its next step anyway, so
`batch_timeout_s` acts only when the engine is idle: the first request to arrive then waits up to
the timeout for company before the engine starts. At low load that is most of the time. The trade
it makes, measured here on the model itself:

- **fuller steps**: the mean number of sequences per decode step grows with the timeout (a count);
- **TTFT**: a request can wait at most the timeout before its batch starts, then at most the step
  in progress, so its TTFT grows by at most the timeout plus a step.

`timeout_trial` serves the same workload (Poisson arrivals, short answers) once per timeout, each
on an engine of its own, and returns what each run measured: per request its TTFT, per run the mean
batch of its decode steps and its longest step, the step time that bounds the TTFT it adds.
"""
from __future__ import annotations

import numpy as np

from minibatch.config import EngineConfig, SamplingParams
from minibatch.llm import LLM
from minibatch.workloads import Fixed, Poisson, load_prompts, make_workload


def timeout_trial(timeouts=(0.0, 0.1, 0.3), num_requests: int = 12, load: float = 0.3, new_tokens: int = 8,
                  model: str = "smollm2-135m", max_batch_size: int = 8, seed: int = 0,
                  rate: float | None = None) -> list[dict]:
    """Serve `num_requests` short questions arriving as a Poisson process, once per timeout (real clock, real
    model); one dict per timeout: its report and the figures above. The rate is `rate` per second, or, by
    default, `load` times what this machine serves one request at a time (from a warm-up's time per token),
    so the engine is idle most of the time on any machine, which is where the timeout acts."""
    runs, workload = [], None
    for timeout in timeouts:
        llm = LLM(EngineConfig(model=model, max_batch_size=max_batch_size, batch_timeout_s=timeout, seed=seed))
        warm = llm.generate([[1] * 8], SamplingParams(max_new_tokens=new_tokens + 1, ignore_eos=True),
                            use_tqdm=False)[0]          # warm-up: the first steps of a process compile
        if workload is None:
            rate = rate or load / (new_tokens * warm.metrics.tpot)
            workload = make_workload(num_requests, arrival=Poisson(rate), output_len=Fixed(new_tokens),
                                     prompts=load_prompts("question"), seed=seed)
        report = llm.run(workload, use_tqdm=False)
        decode = [s.batch_size for s in report.steps if s.num_decode_tokens > 0]
        ttfts = [r.ttft for r in report.requests]
        runs.append({"batch_timeout_s": timeout, "rate": rate, "report": report, "ttft_s": ttfts,
                     "median_ttft_s": float(np.median(ttfts)), "mean_decode_batch": float(np.mean(decode)),
                     "steps": len(report.steps), "longest_step_s": max(s.duration for s in report.steps),
                     "median_step_s": float(np.median([s.duration for s in report.steps]))})
    return runs


def ttft_within_bound(runs: list[dict]) -> list[dict]:
    """Per timeout against no timeout (the first run): the median TTFT added, the bound (the timeout plus
    the longest step of either run) and how many requests kept within it one by one."""
    base = runs[0]
    rows = []
    for run in runs[1:]:
        step = max(run["longest_step_s"], base["longest_step_s"])
        bound = run["batch_timeout_s"] + step
        added = [t - t0 for t, t0 in zip(run["ttft_s"], base["ttft_s"])]
        rows.append({"batch_timeout_s": run["batch_timeout_s"], "added_median_ttft_s": run["median_ttft_s"] -
                     base["median_ttft_s"], "bound_s": bound, "within_bound": sum(a <= bound for a in added),
                     "requests": len(added)})
    return rows
