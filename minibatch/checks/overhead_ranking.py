"""Chapter 13, predict then compute: which model saturates at the larger batch, at several overheads.

The learner commits, before computing anything, (1) for each model the tokens of context (batch x
context) whose KV reads weigh as much as one read of its weights, and (2) for each per-step overhead
in OVERHEADS, which model's tokens/s saturate at the larger batch at CONTEXT tokens. The checker
computes both from the model configs and the shipped H100 roofline profile (modelled, not measured),
with `saturating_batch` on the profile's cost model with its overhead replaced, so the expected
answers follow the profile in use.
"""
from __future__ import annotations

from dataclasses import replace

from minibatch.checks.core import checker
from minibatch.checks.slm_vs_llm import configs, decode_step_s, saturating_batch

OVERHEADS = (0.0, 0.0005, 0.002, 0.01)   # seconds per step: none (CUDA graphs), 0.5 ms, 2 ms (the profile's), 10 ms
CONTEXT = 512                            # tokens of context per sequence
TOLERANCE = 0.10                         # relative, for the crossover counts


def crossover_tokens(config) -> float:
    """Tokens of KV cache whose bytes equal the model's weight bytes (the same bytes per value for both)."""
    from minibatch.sim.costmodel import ModelSize

    size = ModelSize.of(config)
    return (size.body_params + size.lm_head_params) / size.kv_values_per_token


def knees(profile: str = "h100-roofline") -> dict:
    """{overhead_s: {model: saturating batch}} at CONTEXT tokens on the profile with its overhead replaced."""
    from minibatch.sim.costmodel import cost_model

    models = {name: cost_model(profile, config) for name, config in configs().items()}
    return {o: {name: saturating_batch(decode_step_s(replace(cost, overhead_s=o), CONTEXT))
                for name, cost in models.items()} for o in OVERHEADS}


def _crossover_message(name: str, got, config) -> str | None:
    """Why a crossover count is wrong, or None when it is within TOLERANCE."""
    from minibatch.sim.costmodel import ModelSize

    want = crossover_tokens(config)
    if isinstance(got, (int, float)) and abs(got - want) <= TOLERANCE * want:
        return None
    size = ModelSize.of(config)
    near = lambda x: isinstance(got, (int, float)) and abs(got - x) <= TOLERANCE * x      # noqa: E731
    if near(2 * want):
        why = "a token's KV holds keys AND values: 2 x layers x KV heads x head_dim values"
    elif near(size.body_params / size.kv_values_per_token):
        why = "the LM head's vocab x hidden weights are read every step too (they are a fifth of a small model)"
    elif near(want * config.num_attention_heads / config.num_key_value_heads):
        why = "only the KV heads are cached: grouped-query attention shares each among several query heads"
    else:
        why = "divide the weight bytes by the KV bytes of one token of context (the bytes per value cancel)"
    return f"{name}: you said {got!r} tokens, expected about {want:,.0f} (within {TOLERANCE:.0%}): {why}"


@checker("overhead_ranking(), predicted")
def check_overhead_ranking(predict):
    from minibatch.sim.costmodel import load_profile

    answer = predict()
    assert isinstance(answer, dict) and {"crossover_tokens", "later"} <= answer.keys(), (
        "return a dict with 'crossover_tokens' ({model: tokens}) and 'later' ({overhead_s: model})")
    models = configs()
    misses = [m for name, config in models.items()
              if (m := _crossover_message(name, answer["crossover_tokens"].get(name), config))]
    assert not misses, "the crossover, batch x context where KV reads equal the weight reads:\n  " + "\n  ".join(misses)
    table = knees()
    shown = "; ".join(f"{o * 1e3:g} ms: 135M {k['135M']}, 8B {k['8B']}" for o, k in table.items())
    for overhead, knee in table.items():
        right = "135M" if knee["135M"] > knee["8B"] else "8B"
        got = answer["later"].get(overhead)
        if got == right:
            continue
        if right == "8B":
            why = ("with little fixed cost per step, the fixed part is the weight read, and SmolLM2's KV per token is "
                   "large next to its weights: its KV reads overtake its weight reads at about a tenth of the "
                   "batch x context of Llama-3-8B's, so the small model saturates first")
        else:
            hardware = load_profile("h100-roofline")["hardware"]
            per_ms = 1e-3 * hardware["memory_bandwidth"] * hardware["efficiency"] / 1e9
            why = ("a per-step overhead is a fixed cost like the weight read: next to SmolLM2's 0.27 GB it is "
                   f"large (1 ms is worth {per_ms:.1f} GB of reads at the modelled bandwidth), next to Llama-3-8B's "
                   "15 GB it is not, so it pushes the small model's knee out much further")
        raise AssertionError(f"at {overhead * 1e3:g} ms of overhead per step you said {got!r} saturates later; the "
                             f"H100 profile says {right} (saturating batches at context {CONTEXT}: {shown}): {why}")
    print(f"saturating batch at context {CONTEXT} (H100 profile, modelled): {shown}. The knee sits where a "
          "sequence's own reads (its KV) match the step's fixed cost (overhead + weights): the ranking turns with "
          "the overhead because the overhead is large next to a small model's weights and small next to a big one's.")
    return len(models) + len(OVERHEADS)
