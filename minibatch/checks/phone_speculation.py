"""Chapter 10, predict then compute: what speculative decoding gains for one user on a phone.

The learner commits the speed-up of prompt lookup and of a layer-skip draft over plain decoding on the
shipped phone profile (a roofline model of a phone's GPU: modelled, not measured), for given
acceptance rates. The checker computes it with the chapter's rule, speed-up = tokens per step /
step cost, where the step cost comes from the profile's cost model: a verify step runs k + 1 rows
through the whole model, and a layer-skip draft runs k passes through the first layers, each paying
the per-step overhead and its share of the weight reads.
"""
from __future__ import annotations

from dataclasses import replace

from minibatch.checks.core import checker

K, CONTEXT, DRAFT_LAYERS = 4, 512, 10                    # drafts per step, tokens of context, layers of the draft
ACCEPTANCE = {"ngram": 0.8, "layer_skip": 0.5}          # the acceptance rates the prediction is for
TOLERANCE = 0.15


def _shape(rows: int):
    from minibatch.sim.costmodel import StepShape

    return StepShape(decode_seqs=rows, kv_tokens_read=CONTEXT + rows - 1, attention_pairs=rows * CONTEXT,
                     sampled_rows=rows)


def phone_speedups(profile: str = "phone-roofline") -> dict:
    """{method: speed-up} and the step times behind them, from the profile's cost model of smollm2-135m."""
    from minibatch.engine.models import load_model_spec
    from minibatch.engine.speculative import expected_tokens_per_step
    from minibatch.sim.costmodel import cost_model

    config = load_model_spec("smollm2-135m").config
    cost = cost_model(profile, config)
    draft = replace(cost, size=replace(cost.size, body_params=cost.size.body_params * DRAFT_LAYERS
                                       // config.num_hidden_layers))
    plain, verify, draft_pass = cost.step_time(_shape(1)), cost.step_time(_shape(K + 1)), draft.step_time(_shape(1))
    steps = {"ngram": verify / plain, "layer_skip": (verify + K * draft_pass) / plain}   # step costs
    return {"speedup": {m: expected_tokens_per_step(ACCEPTANCE[m], K) / steps[m] for m in ACCEPTANCE},
            "step_cost": steps, "plain_s": plain, "verify_s": verify, "draft_pass_s": draft_pass,
            "overhead_s": cost.overhead_s}


@checker("phone_speedups(), predicted")
def check_phone_speedups(predict):
    from minibatch.engine.speculative import expected_tokens_per_step

    got = predict()
    assert isinstance(got, dict) and set(ACCEPTANCE) <= got.keys(), (
        f"return {{'ngram': speed-up, 'layer_skip': speed-up}}, got {got!r}")
    f = phone_speedups()
    shown = (f"phone profile (modelled): plain step {f['plain_s'] * 1e3:.1f} ms, verify step of {K + 1} rows "
             f"{f['verify_s'] * 1e3:.1f} ms, one draft pass of {DRAFT_LAYERS} layers {f['draft_pass_s'] * 1e3:.1f} ms "
             f"(overhead {f['overhead_s'] * 1e3:.1f} ms each); speed-ups: "
             + ", ".join(f"{m} {v:.2f}x" for m, v in f["speedup"].items()))
    print(shown)
    for method, want in f["speedup"].items():
        answer = got[method]
        if isinstance(answer, (int, float)) and abs(answer - want) <= TOLERANCE * want:
            continue
        tokens = expected_tokens_per_step(ACCEPTANCE[method], K)
        ratio = DRAFT_LAYERS / 30
        near = lambda x: isinstance(answer, (int, float)) and abs(answer - x) <= 0.05 * x   # noqa: E731
        if near(tokens):
            why = (f"{tokens:.2f} is the tokens per step alone: divide by the step cost, a speculative step's time "
                   "over a plain step's")
        elif method == "layer_skip" and near(tokens / (1 + K * ratio)):
            why = ("each draft pass is a step of its own: it pays the per-step overhead as well as a third of the "
                   "weight reads, so a draft costs more than the ratio of layers")
        else:
            why = ("work out the step cost from the profile: the verify step reads the weights once for all "
                   f"{K + 1} rows; a layer-skip draft adds {K} passes of {DRAFT_LAYERS} layers, overhead included")
        raise AssertionError(f"{method}: you predicted {answer!r}, expected {want:.2f}x within {TOLERANCE:.0%} "
                             f"({shown}): {why}")
