"""Chapter 01 (why batch): the roofline's prediction of decode tokens/s against the batch size."""

from minibatch.checks.core import Case, check_cases, checker, same_value


def roofline_tokens_per_s(batch_size, weight_bytes, weight_params, copy_Bps, flop_s):
    """The reference: a decode step reads every weight once and does 2 FLOPs per weight and sequence;
    it lasts as long as the slower of the two, and makes batch_size tokens."""
    memory_s = weight_bytes / copy_Bps
    compute_s = 2 * batch_size * weight_params / flop_s
    return batch_size / max(memory_s, compute_s)


# The usual wrong turns, each with what to think about instead.
MISTAKES = {
    "adds the memory time and the compute time": lambda b, wb, wp, bw, fl: b / (wb / bw + 2 * b * wp / fl),
    "charges the arithmetic of one sequence only": lambda b, wb, wp, bw, fl: b / max(wb / bw, 2 * wp / fl),
    "reads the weights once per sequence": lambda b, wb, wp, bw, fl: b / max(b * wb / bw, 2 * b * wp / fl),
    "counts one FLOP per weight": lambda b, wb, wp, bw, fl: b / max(wb / bw, b * wp / fl),
}
ADVICE = {
    "adds the memory time and the compute time": "a step streams weights and multiplies them at the same "
    "time: it lasts as long as the slower of the two (max), not their sum",
    "charges the arithmetic of one sequence only": "every sequence in the step multiplies every weight: the "
    "arithmetic grows with batch_size",
    "reads the weights once per sequence": "the weights are read once per step, whatever the batch size: "
    "that is the whole point of batching",
    "counts one FLOP per weight": "each weight is multiplied and added: 2 FLOPs per weight and sequence",
}

SMOLLM2_FP32 = (538e6, 134.5e6)          # weight bytes and weight parameters of SmolLM2-135M's matrices, fp32
LAPTOP = (20e9, 150e9)                   # a laptop: copies at 20 GB/s, multiplies at 150 GFLOP/s


@checker("roofline_tokens_per_s(batch_size, weight_bytes, weight_params, copy_Bps, flop_s)")
def check_roofline_tokens_per_s(roofline):
    compute_bound = (64, *SMOLLM2_FP32, *LAPTOP)      # 64 sequences: the arithmetic takes longer than the read
    got = roofline(*compute_bound)
    for mistake, wrong in MISTAKES.items():
        if same_value(got, wrong(*compute_bound)) and not same_value(got, roofline_tokens_per_s(*compute_bound)):
            raise AssertionError(f"on batch_size=64 your function {mistake}: {ADVICE[mistake]}")
    cases = [Case((b, *SMOLLM2_FP32, *LAPTOP), roofline_tokens_per_s(b, *SMOLLM2_FP32, *LAPTOP))
             for b in (1, 2, 8, 32, 64, 256)]
    cases += [Case((1, 2e9, 1e9, 1e11, 1e13), 50.0),          # a 1B-weight model in bf16 on a GPU-like machine
              Case((100, 2e9, 1e9, 1e11, 1e13), 5000.0),      # still memory-bound at 100: the ridge is at 100
              Case((400, 2e9, 1e9, 1e11, 1e13), 5000.0)]      # past the ridge the tokens/s stay flat
    return check_cases(roofline, cases)


# ---- predict, then measure: the batch where tok/s stops nearly doubling -----------------------------------------

GAIN = 1.5                 # the knee: the first batch b (a power of two) from which doubling gains less than this
TOLERANCE = (1.35, 1.65)   # a prediction p passes when doubling from p gains < 1.65x and from p/2 gains > 1.35x
BATCHES = tuple(2 ** k for k in range(10))          # 1 .. 512

MACHINES = {  # made-up machines whose step seconds are a formula of the batch size (decode steps)
    "a GPU-like server (6 ms a step, + 0.04 ms a sequence)": lambda b: 0.006 + 0.00004 * b,
    "a phone (30 ms a step, + 12 ms a sequence)": lambda b: 0.030 + 0.012 * b,
    "a laptop with a heavy per-step overhead (100 ms a step, + 1.5 ms a sequence)": lambda b: 0.100 + 0.0015 * b,
}


def gain(step_s, b):
    """tok/s at batch 2b over tok/s at batch b: a step makes one token per sequence."""
    return (2 * b / step_s(2 * b)) / (b / step_s(b))


def knee(step_s):
    """The first batch in BATCHES from which doubling gains less than GAIN (1024 when none does)."""
    return next((b for b in BATCHES if gain(step_s, b) < GAIN), 2 * BATCHES[-1])


def simulated_decode_step_s():
    """Decode-step seconds against the batch size, measured on the simulated clock with the profile in use."""
    from minibatch import LLM, EngineConfig, SamplingParams

    llm = LLM(EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True, max_batch_size=1024,
                           max_tokens_per_step=8192, num_kv_blocks=2048))
    params, measured = SamplingParams(max_new_tokens=2, ignore_eos=True), {}
    for b in BATCHES + (1024,):
        first = len(llm.engine.step_records)
        llm.generate([[5, 6, 7, 8]] * b, params, use_tqdm=False)
        measured[b] = next(s.duration for s in llm.engine.step_records[first:]
                           if s.num_prefill_tokens == 0 and s.batch_size == b)
    return measured.__getitem__, llm.config.sim_profile


def _score(predict_knee, machine, step_s):
    """AssertionError with what the measured curve says when the prediction falls outside TOLERANCE."""
    p = predict_knee(step_s(1), step_s(8))
    assert isinstance(p, (int, float)) and p >= 1, f"predict_knee must return a batch size (1 or more), got {p!r}"
    p = min(int(round(p)), BATCHES[-1])
    if gain(step_s, p) >= TOLERANCE[1]:
        raise AssertionError(
            f"too early: on {machine} you predicted {p}, but doubling the batch from {p} to {2 * p} still gains "
            f"{gain(step_s, p):.2f}x tok/s. The step's fixed part (every weight read once, the per-step overhead) is "
            "still most of it, and each extra sequence adds only its own small share: estimate the two parts from "
            "step_1_s and step_8_s before you extrapolate")
    if p > 1 and gain(step_s, p // 2) <= TOLERANCE[0]:
        raise AssertionError(
            f"too late: on {machine} you predicted {p}, but doubling from {p // 2} to {p} already gains only "
            f"{gain(step_s, p // 2):.2f}x tok/s. The weights are read once per step, but every sequence still pays "
            "its own arithmetic and KV reads: once that per-sequence part outweighs the fixed part, a bigger batch "
            "mostly makes each step longer")
    return p


@checker("predict_knee(step_1_s, step_8_s): the batch where tok/s stops nearly doubling")
def check_knee_prediction(predict_knee):
    """Scores the prediction on three made-up machines and on the simulated clock (the profile in use)."""
    for machine, step_s in MACHINES.items():
        _score(predict_knee, machine, step_s)
    step_s, profile = simulated_decode_step_s()
    p = _score(predict_knee, f"the simulated clock (profile {profile!r})", step_s)
    measured = knee(step_s)
    print(f"On the simulated clock (profile {profile!r}), measured decode steps:")
    print(" batch  step (ms)  tok/s  gain when doubled")
    for b in BATCHES[:9]:
        print(f"{b:6d} {1e3 * step_s(b):10.1f} {b / step_s(b):6.0f} {gain(step_s, b):12.2f}x")
    print(f"The measured knee (first gain below {GAIN}x) is at batch {measured}; you predicted {p}. Your prediction "
          "passes when the gain from your batch is below 1.65x and from half of it above 1.35x. A decode step is a "
          "fixed part, paid once whatever the batch (every weight streamed from memory once, the engine's per-step "
          "work), plus a part each sequence pays (its arithmetic, its KV reads, its LM-head row). Tokens/s nearly "
          "double while the fixed part dominates and stop doubling once the per-sequence part catches up: two "
          "measured steps fix both parts. On a real machine the per-sequence part is not quite constant (matrix "
          "products of a few rows run below peak), so a measured knee can sit one power of two from this one.")
    return len(MACHINES) + 1
