"""The capstone: a workload, an SLA and a KV memory budget the course has not shown, and a score.

The workload (`workload()`, seeded, the same for everyone): about thirty seconds of traffic to
`smollm2-135m`, in two classes of request.
- chat: short questions and instructions (shipped prompt texts sent as plain text, 7 to 43
  tokens), 8 to 32 new tokens each, arriving as a Poisson process at 1.5 per second, plus two
  bursts of 20 (a class pressing enter at once);
- document: long grounded prompts (correct, summarise, extract from or answer about a given text,
  about 100 to 230 tokens), 48 to 80 new tokens each, arriving at 0.3 per second.

The rules: each class has its own SLA (`SLAS`); at least `TARGET` of each class's requests must meet
every limit of their SLA; the KV cache may take at most `KV_BUDGET_BYTES`.

`score(config)` serves the workload with `config` on the simulated clock without the model, on a
fixed reference machine (the profile `reference-cpu`: the default engine on the course's 2-core
reference CPU, frozen on the day the workload and the SLAs were set for it), so a score is
deterministic, the same for everyone whatever their laptop or engine version, and takes about a
second; `evaluate` scores any run of these requests, e.g. one measured on the real model. The
simulated clock does not model speculative decoding (what it gains depends on the real tokens), so
`score` leaves it out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from minibatch.config import ConfigError, EngineConfig
from minibatch.llm import LLM
from minibatch.analysis.metrics import RunReport, percentile
from minibatch.analysis.sla import SLA
from minibatch.workloads.grounded import grounded_prompts
from minibatch.workloads import Poisson, Uniform, WorkloadRequest, load_prompts, make_workload

MODEL = "smollm2-135m"
SLAS = {"chat": SLA(ttft_s=0.5, tpot_s=0.085, percentile=95),       # a person waits for the first words
        "document": SLA(ttft_s=2.0, tpot_s=0.1, percentile=95)}    # a long job may start later
TARGET = 0.95                       # share of each class's requests that must meet every limit
KV_BUDGET_BYTES = 24 << 20          # the KV cache's memory on this laptop: 24 MiB
CHAT_KINDS = ("question", "instruction", "creative", "code", "maths", "rewrite", "classify", "opinion")
BURSTS = ((7.0, 20), (18.5, 20))    # (seconds, chat requests arriving together at about 36 per second)
CONFIRM_WINDOW = (7.0, 7.5)         # the slice served on the real model: most of the first burst
PROFILE = "reference-cpu"           # the simulated machine every score runs on (see above)


def workload() -> tuple[list[WorkloadRequest], list[str]]:
    """The requests in arrival order and each one's class ("chat" or "document")."""
    chat = [p for kind in CHAT_KINDS for p in load_prompts(kind)]
    docs = grounded_prompts() + load_prompts("answer")
    parts = [(make_workload(40, Poisson(1.5), Uniform(8, 32), prompts=chat, seed=0), "chat", 0.0),
             (make_workload(8, Poisson(0.3), Uniform(48, 80), prompts=docs, seed=1), "document", 0.8)]
    parts += [(make_workload(n, Poisson(36.0), Uniform(8, 32), prompts=chat, seed=2 + i), "chat", at)
              for i, (at, n) in enumerate(BURSTS)]
    tagged = sorted(((replace(w, arrival_s=w.arrival_s + start), kind) for ws, kind, start in parts for w in ws),
                    key=lambda pair: pair[0].arrival_s)
    return [w for w, _ in tagged], [kind for _, kind in tagged]


def confirmation_workload() -> tuple[list[WorkloadRequest], list[str]]:
    """The requests arriving in CONFIRM_WINDOW, shifted to start at 0: short enough for the real model."""
    start, end = CONFIRM_WINDOW
    pairs = [(w, k) for w, k in zip(*workload()) if start <= w.arrival_s < end]
    return [replace(w, arrival_s=w.arrival_s - start) for w, _ in pairs], [k for _, k in pairs]


@dataclass
class Score:
    """How a run of the capstone's requests went, against the SLAs, the target and the KV budget."""

    goodput_req_s: float                 # requests per second that met their class's SLA
    attainment: dict[str, float]         # {class: share of its requests that met every limit}
    tails: dict[str, dict[str, float]]   # {class: {"ttft": p95 s, "tpot": p95 s}}
    over: dict[str, dict[str, int]]      # {class: {metric: requests over the limit}}
    counts: dict[str, int]               # {class: requests}
    kv_bytes: int                        # the KV cache the configuration allocates
    report: RunReport

    @property
    def met(self) -> bool:
        return not self.shortfalls()

    def shortfalls(self) -> list[str]:
        """What keeps this run from passing, one line each (an empty list when it passes)."""
        lines = []
        if self.kv_bytes > KV_BUDGET_BYTES:
            lines.append(f"the KV cache takes {self.kv_bytes / 2**20:.1f} MiB, "
                         f"{(self.kv_bytes - KV_BUDGET_BYTES) / 2**20:.1f} MiB over the budget of "
                         f"{KV_BUDGET_BYTES / 2**20:g} MiB (set num_kv_blocks or kv_cache_memory_bytes)")
        for kind, sla in SLAS.items():
            if self.attainment[kind] >= TARGET:
                continue
            misses = [f"{self.over[kind][m]} over the {m.upper()} limit of {limit:g} s "
                      f"(p95 {self.tails[kind][m]:.2f} s"
                      + (f", {self.tails[kind][m] - limit:.2f} s over)" if self.tails[kind][m] > limit else ")")
                      for m, limit in sla.limits().items() if self.over[kind][m]]
            lines.append(f"{kind}: {self.attainment[kind]:.0%} of {self.counts[kind]} requests met the SLA, "
                         f"the target is {TARGET:.0%}; " + ", ".join(misses or ["some did not finish"]))
        return lines

    def describe(self) -> str:
        parts = [f"goodput {self.goodput_req_s:.3f} req/s"]
        parts += [f"{kind} {self.attainment[kind]:.0%} within SLA (p95 TTFT {self.tails[kind]['ttft']:.2f} s, "
                  f"p95 TPOT {self.tails[kind]['tpot'] * 1e3:.0f} ms)" for kind in SLAS if self.counts[kind]]
        parts.append(f"KV cache {self.kv_bytes / 2**20:.1f} of {KV_BUDGET_BYTES / 2**20:g} MiB")
        return " | ".join(parts)


def evaluate(report: RunReport, classes: list[str], kv_bytes: int) -> Score:
    """Score a run of requests whose classes are `classes` (in the order of report.requests)."""
    if len(classes) != len(report.requests) or not set(classes) <= set(SLAS):
        raise ConfigError(f"classes has {len(classes)} entries for {len(report.requests)} requests: give one of "
                          f"{', '.join(map(repr, SLAS))} per request")
    attainment, tails, over, counts, good = {}, {}, {}, {}, 0
    for kind, sla in SLAS.items():
        runs = [r for r, k in zip(report.requests, classes) if k == kind]
        ok = sum(sla.request_ok(r) for r in runs)
        good += ok
        counts[kind], attainment[kind] = len(runs), ok / len(runs) if runs else 1.0
        tails[kind] = {m: percentile([getattr(r, m) for r in runs if r.e2e is not None], sla.percentile) or 0.0
                       for m in sla.limits()}
        over[kind] = {m: sum(getattr(r, m) is not None and getattr(r, m) > limit for r in runs)
                      for m, limit in sla.limits().items()}
    goodput = good / report.duration if report.duration > 0 else 0.0
    return Score(goodput, attainment, tails, over, counts, kv_bytes, report)


def simulated(config: EngineConfig) -> EngineConfig:
    """The configuration `score` serves: the same batching and KV knobs, on the simulated clock."""
    if not isinstance(config, EngineConfig):
        raise ConfigError(f"config={config!r} is not allowed: pass an EngineConfig")
    if config.model != MODEL:
        raise ConfigError(f"EngineConfig.model={config.model!r} is not allowed: the capstone serves {MODEL!r}")
    if config.dtype not in ("auto", "float32"):
        raise ConfigError(f"EngineConfig.dtype={config.dtype!r} is not allowed: 'auto' or 'float32', the dtype the "
                          "reference CPU profile was measured with")
    return replace(config, clock="simulated", sim_skip_model=True, sim_profile=PROFILE, device="cpu",
                   speculative_method=None, speculative_model=None, profile_steps=False, cuda_graphs=False)


def score(config: EngineConfig, part: tuple[list[WorkloadRequest], list[str]] | None = None) -> Score:
    """Serve the capstone workload with `config` on the simulated clock and score it; `part`, a
    (requests, classes) pair such as confirmation_workload(), serves those requests instead."""
    llm = LLM(simulated(config))
    requests, classes = part or workload()
    return evaluate(llm.run(requests, use_tqdm=False), classes, llm.engine.kv_cache.total_bytes)
