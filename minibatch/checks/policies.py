"""Chapter 11 (scheduling policies): an open lab, a policy that meets every class's p99 TTFT limit."""

from minibatch.checks.core import checker, describe


@checker("choose_policy(base)")
def check_policy_lab(choose_policy):
    from minibatch.analysis.fairness import LAB_BASE, LAB_LIMITS, POLICY_KNOBS, lab_score
    from minibatch.config import ConfigError, EngineConfig

    try:
        config = choose_policy(LAB_BASE)
    except ConfigError as err:                       # EngineConfig refused a field
        raise AssertionError(f"choose_policy(base) built a configuration the engine refuses: {err}") from None
    assert isinstance(config, EngineConfig), f"choose_policy(base) must return an EngineConfig, got {describe(config)}"
    changed = [name for name in vars(LAB_BASE) if getattr(config, name) != getattr(LAB_BASE, name)
               and name not in POLICY_KNOBS]
    assert not changed, (f"only the policy knobs ({', '.join(POLICY_KNOBS)}) may change, but {', '.join(changed)} "
                         "changed too: build the answer with dataclasses.replace(base, ...)")
    score, baseline = lab_score(config), lab_score(LAB_BASE)
    for kind, limit in LAB_LIMITS.items():
        print(f"{kind:9s} p99 TTFT {score[kind]['p99_ttft_s']:6.1f} s (limit {limit:g} s; fcfs: "
              f"{baseline[kind]['p99_ttft_s']:.1f} s)")
    misses = [f"{kind}: p99 TTFT {score[kind]['p99_ttft_s']:.1f} s is over the limit of {limit:g} s"
              for kind, limit in LAB_LIMITS.items() if not score[kind]["p99_ttft_s"] <= limit]
    assert not misses, f"scheduling_policy={config.scheduling_policy!r} misses the SLA:\n  - " + "\n  - ".join(misses)
