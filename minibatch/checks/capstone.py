"""Chapter 15 (capstone): an EngineConfig that serves the capstone's workload within its SLA and KV budget."""

from minibatch.checks.core import checker, learner_config


@checker("choose_config()")
def check_capstone(choose_config):
    from minibatch.tools import capstone
    from minibatch.config import ConfigError

    config = learner_config(choose_config, "choose_config()")
    try:
        score = capstone.score(config)
    except ConfigError as err:                       # e.g. another model, or a KV cache too small for a request
        raise AssertionError(f"the capstone cannot serve this configuration: {err}") from None
    if config.speculative_method:
        print(f"note: speculative_method={config.speculative_method!r} is not simulated, so the score leaves it out; "
              "the real-model run shows what it does")
    print(f"score (simulated clock): {score.describe()}")
    misses = score.shortfalls()
    assert not misses, "the configuration misses the target:\n  - " + "\n  - ".join(misses)
