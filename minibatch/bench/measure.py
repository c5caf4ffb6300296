"""Running the systems side by side: interleaved repetitions, outputs checked, medians and ranges.

Runs are interleaved (A B C D, A B C D, ...) rather than grouped (A A A, B B B), so a change in the
machine's speed during the benchmark (another program, the CPU heating up) falls on every system
alike. Each measured run's outputs are compared with the greedy reference; a system is verified
only if every one of its runs matched. The order the runs actually took is kept with the results.
"""
from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from minibatch.bench.check import compare, merge
from minibatch.bench.workloads import BenchWorkload, poisson_arrivals

ONLINE_METRICS = ("throughput_tok_s", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s", "mean_e2e_s")


def spread(values) -> dict:
    """Median, min and max of repeated measurements, with the samples themselves."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "samples": []}
    return {"median": float(np.median(values)), "min": min(values), "max": max(values), "samples": values}


def run_offline(systems, workload: BenchWorkload, reference, batch_sizes, reps: int, use_tqdm: bool = True) -> dict:
    """Every system at every max batch size, `reps` interleaved times; each system's best batch size."""
    order, runs = [], {s.name: {bs: [] for bs in batch_sizes} for s in systems}
    with tqdm(total=len(batch_sizes) * reps * len(systems), desc="offline", unit="run", disable=not use_tqdm) as bar:
        for bs in batch_sizes:
            for system in systems:
                system.prepare(bs, workload.max_len)
            for rep in range(reps):
                for system in systems:
                    bar.set_postfix_str(f"{system.name} batch {bs}")
                    result = system.offline(workload.prompts, workload.output_lens)
                    runs[system.name][bs].append((result, compare(result.outputs, reference)))
                    order.append({"system": system.name, "batch_size": bs, "rep": rep})
                    bar.update(1)
            for system in systems:
                system.release()
    out = {"order": order, "systems": {}}
    for system in systems:
        rows, matches = [], []
        for bs in batch_sizes:
            results, row_matches = zip(*runs[system.name][bs])
            matches.append(merge(row_matches))
            rows.append({"batch_size": bs, "tok_s": spread(r.tok_s for r in results),
                         "seconds": spread(r.seconds for r in results), "match": matches[-1].to_dict(),
                         "steps": spread(len(r.steps) for r in results) if results[0].steps else None})
        best = max(rows, key=lambda row: row["tok_s"]["median"])
        match = merge(matches)
        out["systems"][system.name] = {"label": system.label, "verified": match.exact, "match": match.to_dict(),
                                       "best_batch_size": best["batch_size"], "by_batch_size": rows}
    return out


def run_online(systems, workload: BenchWorkload, reference, batch_size_of: dict, rates, reps: int, seed: int = 0,
               use_tqdm: bool = True) -> dict:
    """Each system at its batch size, serving Poisson arrivals at every rate, `reps` interleaved times."""
    order, runs = [], {s.name: {rate: [] for rate in rates} for s in systems}
    for system in systems:
        system.prepare(batch_size_of[system.name], workload.max_len)
    n = len(workload.prompts)
    with tqdm(total=len(rates) * reps * len(systems), desc="online", unit="run", disable=not use_tqdm) as bar:
        for rate in rates:
            arrivals = poisson_arrivals(rate, n, seed)
            for rep in range(reps):
                for system in systems:
                    bar.set_postfix_str(f"{system.name} {rate:.2g} req/s")
                    result = system.online(workload.prompts, workload.output_lens, arrivals)
                    runs[system.name][rate].append((result.report.summary(), compare(result.outputs, reference)))
                    order.append({"system": system.name, "rate": rate, "rep": rep})
                    bar.update(1)
    for system in systems:
        system.release()
    out = {"rates": list(rates), "order": order, "systems": {}}
    for system in systems:
        rows, matches = [], []
        for rate in rates:
            summaries, rate_matches = zip(*runs[system.name][rate])
            matches += rate_matches
            rows.append({"rate": rate, **{m: spread(s[m] for s in summaries) for m in ONLINE_METRICS}})
        match = merge(matches)
        out["systems"][system.name] = {"label": system.label, "batch_size": batch_size_of[system.name],
                                       "verified": match.exact, "match": match.to_dict(), "by_rate": rows}
    return out
