"""Chapter 09 (small-model specifics): the overhead share of a step, the batch size that amortises the fixed
cost per step, and a prediction of what batching gains on the simulated clock (`check_batch_gain`)."""

import functools

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


@checker("overhead_share(parts)")
def check_overhead_share(overhead_share):
    """The share of a step outside the model's arithmetic, against the profiler's own answer."""
    from minibatch.analysis.profiler import MODEL_PARTS, PARTS
    from minibatch.analysis.profiler import overhead_share as reference

    rng = np.random.default_rng(8)
    profiles = [{p: float(t) for p, t in zip(PARTS, rng.exponential(1e-3, len(PARTS)))} for _ in range(6)]
    model_only = {p: (1e-3 if p in MODEL_PARTS else 0.0) for p in PARTS}
    overhead_only = {p: (0.0 if p in MODEL_PARTS or p == "propose" else 2e-3) for p in PARTS}
    profiles += [model_only, overhead_only, {**model_only, "propose": 5e-3, "sample": 1e-3}]
    return check_cases(overhead_share, [Case((p,), reference(p)) for p in profiles])


def _smallest_batch(fixed_s, per_seq_s, target_share):
    batch = 1
    while fixed_s / (fixed_s + batch * per_seq_s) > target_share:
        batch += 1
    return batch


@checker("batch_for_fixed_share(fixed_s, per_seq_s, target_share)")
def check_batch_for_fixed_share(batch_for_fixed_share):
    """Smallest batch size whose step spends at most target_share on the fixed per-step cost."""
    cases = [(0.021, 0.001, 0.5), (0.02, 0.0015, 0.45), (0.002, 0.004, 0.9), (0.002, 0.004, 0.3),
             (0.035, 0.0009, 0.25), (0.8, 0.003, 0.05), (0.01, 0.01, 0.999)]   # none on an exact boundary
    return check_cases(batch_for_fixed_share, [Case(c, _smallest_batch(*c)) for c in cases])


BATCH, CONTEXT, TOLERANCE = 32, 128, 0.25   # predict decode tokens/s at BATCH over 1, CONTEXT-token prompts


@functools.lru_cache(maxsize=4)   # deterministic: the checker and its tests reuse one run
def simulated_gain(profile: str | None = None) -> dict:
    """Decode steps of batch 1 and BATCH served on the simulated clock (smollm2-135m's shape, the profile
    in use): {"step_1_s", "step_b_s", "gain"}, the gain being tokens/s at BATCH over tokens/s at 1."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.llm import LLM

    fields = {"sim_profile": profile} if profile else {}
    llm = LLM(EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True, max_batch_size=BATCH,
                           num_kv_blocks=4 * BATCH * (CONTEXT // 16 + 2), **fields))
    steps = {}
    for batch in (1, BATCH):
        first = len(llm.engine.step_records)
        prompts = [[7 + (i * 31 + j) % 900 for j in range(CONTEXT)] for i in range(batch)]
        llm.generate(prompts, SamplingParams(max_new_tokens=24, ignore_eos=True), use_tqdm=False)
        decode = [s.duration for s in llm.engine.step_records[first:]                 # every sequence decoding
                  if not s.num_prefill_tokens and s.batch_size == batch]
        steps[batch] = float(np.median(decode))
    return {"step_1_s": steps[1], "step_b_s": steps[BATCH], "gain": BATCH * steps[1] / steps[BATCH]}


@checker(f"predicted decode tokens/s at batch {BATCH} over batch 1, on the simulated clock")
def check_batch_gain(predict_gain):
    from minibatch.config import EngineConfig

    got = predict_gain()
    figures = simulated_gain()
    want = figures["gain"]
    assert isinstance(got, (int, float)) and got > 0, f"return your predicted gain, a number > 0, got {got!r}"
    profile = EngineConfig().sim_profile
    shown = (f"on the simulated clock ({profile!r}): a decode step of 1 sequence {figures['step_1_s'] * 1e3:.1f} ms, "
             f"of {BATCH} {figures['step_b_s'] * 1e3:.1f} ms, so tokens/s grow {want:.1f}x")
    print(shown)
    if abs(got - want) <= TOLERANCE * want:
        return None
    if abs(got - BATCH) <= TOLERANCE * BATCH and want < 0.75 * BATCH:
        why = (f"{BATCH}x would need a step of {BATCH} to cost what a step of 1 costs: only the fixed part (overhead "
               "and the weight read) is shared; each sequence's own arithmetic and KV reads are paid per sequence")
    elif got < 2:
        why = ("the step's fixed part (overhead and the weight read, paid once per step) is shared by the whole "
               "batch, so a step of many sequences costs far less than that many steps of one")
    elif got < want:
        why = "you overestimated each sequence's own cost next to the fixed cost per step that the batch shares"
    else:
        why = "you underestimated each sequence's own cost (its arithmetic and its KV reads) next to the fixed part"
    share = 1 - (figures["step_b_s"] - figures["step_1_s"]) / (BATCH - 1) / figures["step_1_s"]
    raise AssertionError(f"you predicted {got:.3g}x, {shown} (within {TOLERANCE:.0%} passes). The fixed part is "
                         f"about {share:.0%} of a step of one here: {why}")
