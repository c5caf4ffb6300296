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
