"""Chapter 11 (scheduling policies): an open lab, a policy that meets every class's p99 TTFT limit."""

from minibatch.checks.core import checker, learner_config


@checker("choose_policy(base)")
def check_policy_lab(choose_policy):
    from minibatch.tools.fairness import LAB_BASE, LAB_LIMITS, POLICY_KNOBS, lab_score

    config = learner_config(choose_policy, "choose_policy(base)", LAB_BASE, POLICY_KNOBS)
    score, baseline = lab_score(config), lab_score(LAB_BASE)
    for kind, limit in LAB_LIMITS.items():
        print(f"{kind:9s} p99 TTFT {score[kind]['p99_ttft_s']:6.1f} s (limit {limit:g} s; fcfs: "
              f"{baseline[kind]['p99_ttft_s']:.1f} s)")
    misses = [f"{kind}: p99 TTFT {score[kind]['p99_ttft_s']:.1f} s is over the limit of {limit:g} s"
              for kind, limit in LAB_LIMITS.items() if not score[kind]["p99_ttft_s"] <= limit]
    assert not misses, f"scheduling_policy={config.scheduling_policy!r} misses the SLA:\n  - " + "\n  - ".join(misses)
