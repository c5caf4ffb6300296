"""Chapter 15 (capstone): an EngineConfig that serves the capstone's workload within its SLA and KV budget."""

from minibatch.checks.core import checker, describe


@checker("choose_config()")
def check_capstone(choose_config):
    from minibatch.analysis import capstone
    from minibatch.config import ConfigError, EngineConfig

    try:
        config = choose_config()
    except ConfigError as err:                       # EngineConfig refused a field
        raise AssertionError(f"choose_config() built a configuration the engine refuses: {err}") from None
    assert isinstance(config, EngineConfig), f"choose_config() must return an EngineConfig, got {describe(config)}"
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
