"""The open lab of chapter 05: decode-first against prefill-first under a burst of long prompts.

Short chats are decoding when six long documents arrive within a second
(`minibatch.workloads.mixed.long_prompt_burst`, with chats at 4 per second for five seconds, on the
simulated clock). Who takes each step's token
budget first decides who waits: decode-first (`EngineConfig.step_priority`) keeps the chats' tokens
flowing while the documents prefill in what is left of the budget; prefill-first gives the
documents the budget first, and the chats no token until the burst's prompts leave room.

`BURST_BASE` is the server (on `reference-cpu`, a fixed reference machine, so the lab is the same on
every laptop and after every recalibration), of which only `BURST_KNOBS` may change; `BURST_LIMITS` is the SLA, per
class: no chat reader waits longer than a limit between two tokens (the stall a TPOT averages away,
chapter 05), and the documents' p99 TTFT. `burst_score(config)` serves the lab under a configuration
and returns each class's figures; `format_scores` prints several side by side.
"""
from __future__ import annotations

from dataclasses import replace

from minibatch.analysis.metrics import class_tails
from minibatch.config import EngineConfig
from minibatch.llm import LLM
from minibatch.workloads.mixed import long_prompt_burst

BURST_BASE = EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True, max_batch_size=16,
                          sim_profile="reference-cpu")   # the fixed reference machine the limits were set for
BURST_KNOBS = ("step_priority", "max_tokens_per_step")
BURST_LIMITS = {("chat", "longest_gap_s"): 0.6,       # seconds: the longest wait of any chat between two tokens
                ("document", "p99_ttft_s"): 11.0}     # seconds: a document's answer may start later
BURST_DAY = dict(chat_rate=4.0, burst_at_s=5.0, burst_length_s=1.0)   # the lab's traffic (long_prompt_burst's knobs)
NAMES = {"longest_gap_s": "longest gap between two tokens", "p99_tpot_s": "p99 TPOT", "p99_ttft_s": "p99 TTFT"}


def burst_score(config: EngineConfig) -> dict[str, dict[str, float]]:
    """{"chat": {"longest_gap_s", "p99_tpot_s"}, "document": {"p99_ttft_s"}}: the lab served under `config`,
    in simulated seconds."""
    requests, classes = long_prompt_burst(**BURST_DAY)
    requests = [replace(w, params=replace(w.params, priority=0)) for w in requests]   # priorities need "priority"
    report = LLM(config).run(requests, use_tqdm=False)
    gaps, tpot = class_tails(report, classes, "max_itl"), class_tails(report, classes, "tpot")
    ttft = class_tails(report, classes, "ttft")
    return {"chat": {"longest_gap_s": gaps["chat"]["max_max_itl_s"], "p99_tpot_s": tpot["chat"]["p99_tpot_s"]},
            "document": {"p99_ttft_s": ttft["document"]["p99_ttft_s"]}}


def misses(score: dict[str, dict[str, float]]) -> list[str]:
    """One line per limit of `BURST_LIMITS` the score misses, saying by how much."""
    return [f"{kind}: {NAMES[figure]} {score[kind][figure]:.2f} s is over the limit of {limit:g} s by "
            f"{score[kind][figure] - limit:.2f} s" for (kind, figure), limit in BURST_LIMITS.items()
            if not score[kind][figure] <= limit]


def format_scores(configs: dict[str, EngineConfig]) -> str:
    """A table with a row per named configuration: its two knobs and the lab's figures, in simulated seconds."""
    gap, ttft = BURST_LIMITS[("chat", "longest_gap_s")], BURST_LIMITS[("document", "p99_ttft_s")]
    lines = [f"{'config':14s} {'step_priority':>14s} {'budget':>6s} {f'chat longest gap (<= {gap:g})':>27s} "
             f"{'chat p99 TPOT':>14s} {f'document p99 TTFT (<= {ttft:g})':>29s}"]
    for name, config in configs.items():
        score = burst_score(config)
        lines.append(f"{name:14s} {config.step_priority:>14s} {config.max_tokens_per_step:6d} "
                     f"{score['chat']['longest_gap_s']:27.2f} {score['chat']['p99_tpot_s']:14.2f} "
                     f"{score['document']['p99_ttft_s']:29.2f}")
    return "\n".join(lines)
