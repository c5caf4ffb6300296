"""Chapter 05 (prefill versus decode): the largest token budget that keeps a stated inter-token latency,
and what it costs the long prompt's TTFT; the learner's budget then serves the stall scenario. And the
open lab: decode-first or prefill-first, and a budget, for a burst of long prompts within a per-class SLA."""

import math

from minibatch.checks.core import Case, check_cases, checker, learner_config


def pick_token_budget(step_s, num_decoding, itl_limit_s, candidates):
    """The reference: the largest budget whose fullest step, num_decoding decode tokens plus a chunk of
    budget - num_decoding prompt tokens, lasts at most itl_limit_s (None if none does)."""
    fits = [b for b in candidates if b > num_decoding and step_s(b - num_decoding, num_decoding) <= itl_limit_s]
    return max(fits, default=None)


def long_prompt_ttft(step_s, budget, num_decoding, prompt_tokens):
    """The reference: the prompt goes in chunks of budget - num_decoding tokens, each in a step with the decoders."""
    chunk = budget - num_decoding
    full, rest = divmod(prompt_tokens, chunk)
    return full * step_s(chunk, num_decoding) + (step_s(rest, num_decoding) if rest else 0.0)


def _profile_step_s(profile="smollm2-135m-cpu"):
    """A step's seconds from the simulator's shipped cost model, without its (small) KV-read term."""
    from minibatch.sim.costmodel import StepShape, cost_model

    model = cost_model(profile)
    return lambda prefill_tokens, decode_seqs: model.step_time(StepShape(prefill_tokens, decode_seqs))


def _hand_step_s(prefill_tokens, decode_seqs):
    return 0.010 + 0.001 * prefill_tokens + 0.002 * decode_seqs      # 10 ms a step, 1 ms a prompt token


CANDIDATES = (16, 32, 64, 128, 256, 512, 1024)


@checker("pick_token_budget(step_s, num_decoding, itl_limit_s, candidates)")
def check_pick_token_budget(pick):
    if pick(_hand_step_s, 30, 0.110, CANDIDATES) == 128:           # 98 prompt tokens and 30 decoders: 0.168 s
        raise AssertionError("with 30 decoders and a limit of 0.110 s you picked 128: the decoders' tokens cost time "
                             "too; ask step_s for (budget - num_decoding) prompt tokens and num_decoding decode tokens")
    if pick(_hand_step_s, 8, 0.085, CANDIDATES) == 32:             # 56 prompt + 8 decode tokens: 0.082 s, it fits
        raise AssertionError("with 8 decoders and a limit of 0.085 s you picked 32, but 64 fits: a step of budget 64 "
                             "carries the 8 decode tokens and 56 prompt tokens, not 64 prompt tokens plus the decoders")
    if pick(_hand_step_s, 3, 0.300, CANDIDATES) == 16:
        raise AssertionError("with 3 decoders and a limit of 0.300 s you picked 16: the largest budget that fits "
                             "is wanted (the long prompt's TTFT shrinks with it), not the smallest")
    cases = [Case((_hand_step_s, 3, 0.080, CANDIDATES), 64),        # 61 prompt + 3 decode tokens: 0.077 s
             Case((_hand_step_s, 3, 0.300, CANDIDATES), 256),       # 253 + 3: 0.269 s
             Case((_hand_step_s, 0, 0.010, CANDIDATES), None),      # even 16 prompt tokens take 0.026 s
             Case((_hand_step_s, 20, 0.070, CANDIDATES), 32),       # 16 <= 20 decoders leaves no room; 12 + 20: 0.062 s
             Case((_hand_step_s, 20, 0.050, CANDIDATES), None),     # 16 would fit, but the decoders fill it
             Case((_hand_step_s, 30, 0.110, CANDIDATES), 64),       # 34 + 30: 0.104 s
             Case((_hand_step_s, 3, 10.0, (1024, 16, 256)), 1024)]  # candidates in any order
    step_s = _profile_step_s()
    cases += [Case((step_s, d, limit, CANDIDATES), pick_token_budget(step_s, d, limit, CANDIDATES))
              for d in (1, 3, 8) for limit in (0.3, 0.6, 1.5, 3.0)]
    return check_cases(pick, cases)


@checker("long_prompt_ttft(step_s, budget, num_decoding, prompt_tokens)")
def check_long_prompt_ttft(ttft):
    if math.isclose(ttft(_hand_step_s, 64, 4, 512), 8 * _hand_step_s(64, 4)):
        raise AssertionError("with budget 64 and 4 decoders each chunk holds 60 prompt tokens, not 64: the decoders' "
                             "tokens take their share of every step's budget")
    cases = [Case((_hand_step_s, 64, 4, 120), 2 * _hand_step_s(60, 4)),           # two full chunks
             Case((_hand_step_s, 64, 4, 130), 2 * _hand_step_s(60, 4) + _hand_step_s(10, 4)),   # and a short last one
             Case((_hand_step_s, 1024, 0, 512), _hand_step_s(512, 0))]              # no decoders: one step
    step_s = _profile_step_s()
    cases += [Case((step_s, b, d, n), long_prompt_ttft(step_s, b, d, n)) for b in (32, 256) for d in (0, 3)
              for n in (100, 512, 2000)]
    return check_cases(ttft, cases)


def serve_stall_with(budget, num_decoding=3, long_prompt_tokens=512):
    """The chapter's stall scenario on the simulated clock (shapes only) with a token budget; returns the
    long request's TTFT and the decoders' longest wait for a token, in simulated seconds."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.widgets.chunking import stall_numbers, stall_workload

    llm = LLM(EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True, max_batch_size=16,
                           max_tokens_per_step=budget, num_kv_blocks=128))
    workload = stall_workload(list(range(100, 100 + long_prompt_tokens)), long_prompt_tokens, num_decoding,
                              decode_tokens=64)
    return stall_numbers(llm.run(workload, use_tqdm=False))


@checker("choose_step_order(base)")
def check_burst_lab(choose_step_order):
    """The open lab: the learner's step priority and token budget serve the long-prompt burst within its SLA."""
    from minibatch.tools.burst import BURST_BASE, BURST_KNOBS, BURST_LIMITS, NAMES, burst_score, misses

    config = learner_config(choose_step_order, "choose_step_order(base)", BURST_BASE, BURST_KNOBS)
    score = burst_score(config)
    for (kind, figure), limit in BURST_LIMITS.items():
        print(f"{kind:9s} {NAMES[figure]:31s} {score[kind][figure]:6.2f} s (limit {limit:g} s)")
    print(f"{'chat':9s} {'p99 TPOT (not in the SLA)':31s} {score['chat']['p99_tpot_s']:6.2f} s")
    found = misses(score)
    assert not found, (f"step_priority={config.step_priority!r} with max_tokens_per_step={config.max_tokens_per_step} "
                       "misses the SLA:\n  - " + "\n  - ".join(found))


@checker("your chunked-prefill scheduler, serving requests inside the engine", debug=True)
def check_budget_scheduler(scheduler_class):
    """Debugging exercise: the learner's scheduler runs inside the engine with its guards on (a plan over the token
    budget stops the run with the guard's message), then its plans and tokens are compared with the engine's."""
    from minibatch.checks.build import check_scheduler

    return check_scheduler.__wrapped__(scheduler_class)
