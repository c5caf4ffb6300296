"""Chapter 11 (scheduling policies): an open lab, a policy that meets every class's p99 TTFT limit.

The checker serves the lab's workload under the learner's configuration and under fcfs, prints each
class's p99 TTFT beside fcfs's, and, when a class misses its limit, says what starves it under the
policy chosen; when both meet, it says what the configurations that pass have in common.
"""

from minibatch.checks.core import checker, learner_config

WHY_MISSED = {
    "chat": "chats wait behind the documents' long prefills and behind each other in the rush: fcfs serves them in "
            "arrival order, whatever their size. Let short prompts go first (scheduling_policy='shortest_prompt' or "
            "'priority'), and check that nothing else keeps overtaking them",
    "document": "documents starve: with short prompts always first, a document waits until the rush is over, and "
                "under 'priority' it is also preempted, so it must prefill its whole prompt again. Bound how long a "
                "long prompt can be overtaken (aging_tokens_per_s: a waiting request gains that many tokens of "
                "precedence per second) instead of preempting it",
}
WINNERS = ("the configurations that meet both limits put short prompts first and let a waiting document age "
           "past newer chats: precedence for the interactive class, a bound on the batch class's wait, and no "
           "preemption that throws a document's prefill away")


@checker("choose_policy(base)")
def check_policy_lab(choose_policy):
    from minibatch.tools.fairness import LAB_BASE, LAB_LIMITS, POLICY_KNOBS, lab_score

    config = learner_config(choose_policy, "choose_policy(base)", LAB_BASE, POLICY_KNOBS)
    score, baseline = lab_score(config), lab_score(LAB_BASE)
    for kind, limit in LAB_LIMITS.items():
        print(f"{kind:9s} p99 TTFT {score[kind]['p99_ttft_s']:6.1f} s (limit {limit:g} s; fcfs: "
              f"{baseline[kind]['p99_ttft_s']:.1f} s)")
    misses = [f"{kind}: p99 TTFT {score[kind]['p99_ttft_s']:.1f} s is over the limit of {limit:g} s: {WHY_MISSED[kind]}"
              for kind, limit in LAB_LIMITS.items() if not score[kind]["p99_ttft_s"] <= limit]
    assert not misses, f"scheduling_policy={config.scheduling_policy!r} misses the SLA:\n  - " + "\n  - ".join(misses)
    print(f"Both classes meet their limits (simulated clock). {WINNERS[0].upper()}{WINNERS[1:]}.")
