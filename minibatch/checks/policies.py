"""Chapter 11 (scheduling policies): an open lab, a policy that meets every class's p99 TTFT limit.

The checker serves the lab's workload under the learner's configuration and under fcfs, prints each
class's p99 TTFT beside fcfs's, and, when a class misses its limit, says what starves it under the
policy chosen; when both meet, it says what the configurations that pass have in common.
"""

from minibatch.checks.core import checker, learner_config


def why_missed(kind: str, config) -> str:
    """What starves `kind` under the learner's policy, and which knob moves it."""
    policy, aging = config.scheduling_policy, config.aging_tokens_per_s
    if kind == "chat" and policy == "shortest_prompt" and aging == 0:
        return ("without aging a chat of 60 tokens loses to every chat of 20 for as long as the rush lasts, and so "
                "does every document: give a waiting request some precedence per second (aging_tokens_per_s)")
    if kind == "chat" and policy == "shortest_prompt":
        return (f"with aging_tokens_per_s={aging:g} a waiting document gains precedence so fast that it overtakes the "
                "rush's chats within seconds (a document of L tokens outranks a chat of s tokens arriving more than "
                "(L - s) / aging_tokens_per_s seconds after it): lower it, and watch the documents' tail")
    if kind == "chat":
        return ("chats wait behind the documents' long prefills and behind each other in the rush: fcfs serves them "
                "in arrival order, whatever their size. Let short prompts go first (scheduling_policy="
                "'shortest_prompt' or 'priority'), and check that nothing else keeps overtaking them")
    if policy == "priority":
        return ("documents starve: chats always go first, and a running document is preempted, so it must prefill its "
                "whole prompt again. Bound how long a long prompt can be overtaken (scheduling_policy="
                "'shortest_prompt' with aging_tokens_per_s) instead of preempting it")
    if policy == "shortest_prompt":
        wait = 1000 / aging if aging > 0 else float("inf")
        return (f"documents starve: short prompts go first, and with aging_tokens_per_s={aging:g} a document of about "
                f"1,000 tokens outranks newer chats only after {wait:.0f} s of waiting (for ever without aging). "
                "Raise it, so a waiting document ages past the rush sooner, and watch the chats' tail")
    return ("documents wait behind the rush's chats and each other's long prefills: in arrival order nothing "
            "shortens their queue")


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
    misses = [f"{kind}: p99 TTFT {score[kind]['p99_ttft_s']:.1f} s is over the limit of {limit:g} s: "
              f"{why_missed(kind, config)}"
              for kind, limit in LAB_LIMITS.items() if not score[kind]["p99_ttft_s"] <= limit]
    assert not misses, f"scheduling_policy={config.scheduling_policy!r} misses the SLA:\n  - " + "\n  - ".join(misses)
    print(f"Both classes meet their limits (simulated clock). {WINNERS[0].upper()}{WINNERS[1:]}.")
