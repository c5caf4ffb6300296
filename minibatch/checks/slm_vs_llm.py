"""Chapter 13 (SLM versus LLM batching): the knee of the tokens/s curve, where batching stops paying
in full, for the 135M model and Llama-3-8B's shape on a GPU and on a CPU; and a prediction of which
of the two saturates later, at several per-step overheads (`check_overhead_ranking`)."""

from minibatch.checks.core import Case, check_cases, checker

LIMIT = 1 << 16                     # the batch whose tokens/s stand for "any batch": the ceiling


def saturating_batch(step_s, limit=LIMIT):
    """The reference: the smallest batch whose tokens/s, batch / step_s(batch), reach half of the
    tokens/s at `limit` (tokens/s grow with the batch, so a bisection finds it)."""
    ceiling = limit / step_s(limit)
    low, high = 1, limit
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if mid / step_s(mid) >= ceiling / 2 else (mid + 1, high)
    return low


def decode_step_s(cost, context):
    """A decode step's seconds under a cost model, for batches whose sequences hold `context` tokens each."""
    from minibatch.analysis.roofline import step_parts

    return lambda batch: step_parts(cost, batch, context)["step_s"]


def configs() -> dict:
    """The two models compared: SmolLM2-135M (the course's) and Llama-3-8B's shape (8 KV heads, GQA)."""
    from transformers import LlamaConfig

    from minibatch.engine.models import load_model_spec

    llama3_8b = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                            head_dim=128, intermediate_size=14336, vocab_size=128256)
    return {"135M": load_model_spec("smollm2-135m").config, "8B": llama3_8b}


def shapes():
    """The cost models the checker and the exercise use: SmolLM2-135M and Llama-3-8B on the shipped GPU
    profile (H100-class, bfloat16) and on a CPU like this course's laptop (fp32, modelled)."""
    from minibatch.sim.costmodel import ModelSize, RooflineCostModel, cost_model

    laptop = lambda config: RooflineCostModel(1.5e11, 2e10, 2e-3, 4, 0.7, ModelSize.of(config))   # noqa: E731
    out = {}
    for name, config in configs().items():
        out[(name, "GPU")], out[(name, "CPU")] = cost_model("h100-roofline", config), laptop(config)
    return out


def _hand_step_s(batch):
    return 0.010 + 0.001 * batch        # 10 ms fixed, 1 ms a sequence: tokens/s rise towards 1000


@checker("saturating_batch(step_s, limit)")
def check_saturating_batch(knee):
    right = saturating_batch(_hand_step_s, 100)                              # 9: 9 / 0.019 s >= 909 / 2 tokens/s
    got = knee(_hand_step_s, 100)
    if got == 50:
        raise AssertionError("for 10 ms a step plus 1 ms a sequence and limit 100 you answered 50, half the limit: "
                             "the knee is where the tokens/s reach half of the tokens/s at the limit "
                             f"({100 / _hand_step_s(100):.0f}), which batch {right} already does")
    if got == right + 1 or got == right - 1:
        raise AssertionError(f"for 10 ms a step plus 1 ms a sequence and limit 100 you answered {got}: batch {right} "
                             f"makes {right / _hand_step_s(right):.1f} tokens/s, batch {right - 1} "
                             f"{(right - 1) / _hand_step_s(right - 1):.1f}, and half the ceiling is "
                             f"{50 / _hand_step_s(100):.1f}: the smallest batch that reaches it is wanted")
    cases = [Case((_hand_step_s, 100), right), Case((_hand_step_s, 1000), saturating_batch(_hand_step_s, 1000)),
             Case((lambda b: 0.001 * b, 64), 1),                               # no fixed cost: batch 1 is already there
             Case((lambda b: 0.5, 64), 32)]                                    # all fixed cost: half the batch
    cases += [Case((decode_step_s(cost, context), LIMIT), saturating_batch(decode_step_s(cost, context)))
              for cost in shapes().values() for context in (128, 2048)]
    return check_cases(knee, cases)
