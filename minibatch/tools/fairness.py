"""Fairness between classes of request: latency per class, and the same workload under several policies.

A policy that serves one class first makes another wait: the mean hides it, the table per class
shows it. `minibatch.analysis.metrics.class_tails(report, classes)` gives each class's percentiles
of one metric (TTFT by default); `compare_policies(workload, classes, configs)` serves the same
requests under each named configuration and returns one row per (configuration, class), ready to
print or check against a per-class SLA.

The open lab of chapter 11 lives here too: `lab_workload()` (chats with a rush hour and long
documents, on the simulated clock), `LAB_BASE` (the server: only its policy knobs may change) and
`LAB_LIMITS` (each class's p99 TTFT limit). `lab_score(config)` serves the lab under a config.
"""
from __future__ import annotations

from dataclasses import replace

from minibatch.analysis.metrics import class_tails
from minibatch.config import EngineConfig
from minibatch.llm import LLM
from minibatch.workloads.mixed import chat_and_documents

PERCENTILES = (50, 99)


def compare_policies(workload, classes: list[str], configs: dict[str, EngineConfig], metric: str = "ttft",
                     percentiles: tuple[float, ...] = PERCENTILES) -> list[dict]:
    """Serve `workload` once per named config and return a row per (name, class): {"config": name,
    "class": kind, "requests": n, "p50_ttft_s": ..., ...}. Priorities are sent only to a config with
    scheduling_policy="priority" (the engine refuses them elsewhere, as vLLM does)."""
    rows = []
    for name, config in configs.items():
        requests = workload if config.scheduling_policy == "priority" else [
            replace(w, params=replace(w.params, priority=0)) for w in workload]
        report = LLM(config).run(requests, use_tqdm=False)
        for kind, tails in class_tails(report, classes, metric, percentiles).items():
            rows.append({"config": name, "class": kind, **tails})
    return rows


def format_table(rows: list[dict], metric: str = "ttft", percentiles: tuple[float, ...] = PERCENTILES) -> str:
    """compare_policies' rows as a fixed-width text table, seconds with one decimal."""
    keys = [f"p{q:g}_{metric}_s" for q in percentiles] + [f"max_{metric}_s"]
    width = max(len(str(r["config"])) for r in rows)
    width = max(width, len("config"))
    lines = [f"{'config':{width}s}  {'class':9s} {'n':>4s} " + " ".join(f"{k:>12s}" for k in keys)]
    for r in rows:
        cells = " ".join(f"{r[k]:12.1f}" if r[k] is not None else f"{'-':>12s}" for k in keys)
        lines.append(f"{str(r['config']):{width}s}  {r['class']:9s} {r['requests']:4d} {cells}")
    return "\n".join(lines)


# on `reference-cpu`, a fixed reference machine, so the lab is the same on every laptop: its limits and
# workload were set for that machine (on a faster profile fcfs would meet them and the lab ask nothing)
LAB_BASE = EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True, max_batch_size=16,
                        sim_profile="reference-cpu")
LAB_LIMITS = {"chat": 6.0, "document": 12.0}         # p99 TTFT in seconds: a person waits; a report may start later
POLICY_KNOBS = ("scheduling_policy", "aging_tokens_per_s", "long_prefill_token_threshold")


def lab_workload():
    """(requests, classes): fifty seconds of chats at 1.5/s with a ten-second rush at 7.2/s, and documents."""
    return chat_and_documents(duration_s=50.0, chat_rate=1.5, doc_rate=0.18, rush=(20.0, 10.0), rush_rate=7.2,
                              seed=3)


def lab_score(config: EngineConfig) -> dict[str, dict]:
    """{class: its TTFT row (p50, p99, max, requests)} for the lab served under `config`."""
    requests, classes = lab_workload()
    rows = compare_policies(requests, classes, {"config": config})
    return {row["class"]: row for row in rows}
