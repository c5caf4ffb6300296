"""Chapters 08-14: each checker rejects the planted wrong answers with a message that teaches (asserted on a
key phrase), reports the handed-out stub as unsolved, and passes the reference answer."""

import math

import numpy as np

from minibatch.checks.core import CheckResult


def rejected(check, *answers) -> str:
    """The message a checker gives a wrong answer: its AssertionError, or its "not solved yet" result."""
    try:
        result = check(*answers)
    except AssertionError as err:
        return str(err)
    assert isinstance(result, CheckResult) and not result.solved, f"a planted wrong answer passed: {result}"
    return result.message


def unsolved(check, *answers) -> str:
    """The message of a checker that must report `not solved yet` (a stub), raising nothing."""
    result = check(*answers)
    assert isinstance(result, CheckResult) and not result.solved and "not solved yet" in result.message, result
    return result.message


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write this part")


# ---- chapter 08: the paged decode loop that reads the wrong block ---------------------------------

def _decode_loop(block_of, scale_too=True, kv_modulo=False, rows_of=None):
    """The exercise's loop with a chosen block formula, as a learner might leave it."""
    def paged_decode_attention(query, k_cache, v_cache, block_table, context_len, scale):
        num_heads, head_dim = query.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        out = np.zeros((num_heads, head_dim), dtype=np.float32)
        length = rows_of(block_table, block_size) if rows_of else context_len
        for head in range(num_heads):
            kv = head % num_kv_heads if kv_modulo else head // (num_heads // num_kv_heads)
            cells = [(block_table[block_of(p, block_size)], p % block_size) for p in range(length)]
            scores = np.array([query[head] @ k_cache[b, r, kv] * (scale if scale_too else 1.0) for b, r in cells])
            weights = np.exp(scores - scores.max())
            out[head] = weights / weights.sum() @ np.stack([v_cache[b, r, kv] for b, r in cells])
        return out
    return paged_decode_attention


def test_08_paged_loop():
    from minibatch.checks.paged_kernel import check_paged_decode_fix

    assert check_paged_decode_fix(_decode_loop(lambda p, b: p // b)).solved
    buggy = unsolved(check_paged_decode_fix, _decode_loop(lambda p, b: (p + 1) // b))      # the handed-out bug
    assert "shorter than one block" in buggy and "read from the block after it" in buggy
    minus_one = _decode_loop(lambda p, b: (p + 1) // b - 1)
    assert "wraps round to the LAST block" in rejected(check_paged_decode_fix, minus_one)
    assert "past context_len" in rejected(check_paged_decode_fix,
                                          _decode_loop(lambda p, b: p // b, rows_of=lambda t, b: len(t) * b))
    assert "h // (Hq // Hkv)" in rejected(check_paged_decode_fix, _decode_loop(lambda p, b: p // b, kv_modulo=True))
    assert "too sharp" in rejected(check_paged_decode_fix, _decode_loop(lambda p, b: p // b, scale_too=False))
    assert "runs off the end" in rejected(check_paged_decode_fix, _decode_loop(lambda p, b: p // b + 1))
    assert "not solved yet" in unsolved(check_paged_decode_fix, stub)


# ---- chapter 13: which model saturates later, at several overheads --------------------------------

def _ranking(crossover_scale=1.0, later=None, lm_head=True):
    """A prediction with the crossovers scaled (a planted slip) and a chosen ranking."""
    from minibatch.checks.overhead_ranking import OVERHEADS, knees
    from minibatch.checks.slm_vs_llm import configs
    from minibatch.sim.costmodel import ModelSize

    def predict():
        sizes = {n: ModelSize.of(c) for n, c in configs().items()}
        cross = {n: crossover_scale * (s.body_params + (s.lm_head_params if lm_head else 0)) / s.kv_values_per_token
                 for n, s in sizes.items()}
        right = {o: max(k, key=k.get) for o, k in knees().items()}
        return {"crossover_tokens": cross, "later": {o: (later or right)[o] for o in OVERHEADS}}
    return predict


def test_13_overhead_ranking():
    from minibatch.checks.overhead_ranking import OVERHEADS, check_overhead_ranking

    assert check_overhead_ranking(_ranking()).solved
    assert "keys AND values" in rejected(check_overhead_ranking, _ranking(crossover_scale=2.0))
    assert "LM head" in rejected(check_overhead_ranking, _ranking(lm_head=False))
    always_small = {o: "135M" for o in OVERHEADS}             # "a small model batches deep" at every overhead
    assert "at 0 ms of overhead" in (msg := rejected(check_overhead_ranking, _ranking(later=always_small)))
    assert "a tenth of the batch x context" in msg
    always_big = {o: "8B" for o in OVERHEADS}                 # "the bigger model always saturates later"
    assert "fixed cost like the weight read" in rejected(check_overhead_ranking, _ranking(later=always_big))
    assert "not solved yet" in unsolved(check_overhead_ranking, stub)


# ---- chapter 09: the overhead share, the batch that amortises the fixed cost, the gain of a batch ---

def test_09_small_models():
    from minibatch.analysis.profiler import MODEL_PARTS, overhead_share
    from minibatch.checks.small_models import (check_batch_for_fixed_share, check_batch_gain, check_overhead_share,
                                               simulated_gain)

    assert check_overhead_share(overhead_share).solved
    everything = lambda parts: 1.0                                                          # noqa: E731
    with_model = lambda parts: (parts["schedule"] + parts["attention"]) / sum(parts.values())  # noqa: E731
    with_drafts = lambda parts: 1 - sum(parts[p] for p in MODEL_PARTS) / sum(parts.values())  # noqa: E731
    for wrong in (everything, with_model, with_drafts):
        assert "expected:" in rejected(check_overhead_share, wrong)
    smallest = lambda f, p, t: max(1, math.ceil(f * (1 - t) / (t * p)))                      # noqa: E731
    assert check_batch_for_fixed_share(smallest).solved
    for wrong in (lambda f, p, t: int(f / p), lambda f, p, t: int(f * (1 - t) / (t * p)), lambda f, p, t: 1):
        assert "expected:" in rejected(check_batch_for_fixed_share, wrong)

    gain = simulated_gain()["gain"]
    assert check_batch_gain(lambda: gain).solved
    assert "only the fixed part" in rejected(check_batch_gain, lambda: 32.0)                # perfect scaling
    assert "shared by the whole batch" in rejected(check_batch_gain, lambda: 1.0)           # batching gains nothing
    assert "overestimated each sequence's own cost" in rejected(check_batch_gain, lambda: gain / 2)
    assert "not solved yet" in unsolved(check_batch_gain, stub)


# ---- chapter 10: the speed-up rule, and what speculation gains on a phone --------------------------

def test_10_speculation():
    from minibatch.checks.phone_speculation import ACCEPTANCE, K, check_phone_speedups, phone_speedups
    from minibatch.checks.speculation import check_speculation_speedup
    from minibatch.engine.speculative import expected_tokens_per_step as tokens

    assert check_speculation_speedup(tokens, lambda a, k, c: tokens(a, k) / c).solved
    for wrong_tokens, wrong_speedup in ((lambda a, k: 1 + a * k, lambda a, k, c: tokens(a, k) / c),    # linear
                                        (tokens, lambda a, k, c: tokens(a, k) * c),                    # times the cost
                                        (tokens, lambda a, k, c: tokens(a, k) / (1 + k * c))):  # per draft
        assert "expected:" in rejected(check_speculation_speedup, wrong_tokens, wrong_speedup)

    from minibatch.checks.speculation import check_verify_greedy
    from minibatch.engine.speculative import verify_greedy

    assert check_verify_greedy(verify_greedy).solved
    no_own_token = lambda d, t: verify_greedy(d, t)[:-1]                                        # noqa: E731
    keeps_going = lambda d, t: [x for x, y in zip(d, t) if x == y] + [t[len(d)]]               # skips mismatches
    all_drafts = lambda d, t: list(d) + [t[len(d)]]                                             # accepts everything
    for wrong in (no_own_token, keeps_going, all_drafts):
        assert "expected:" in rejected(check_verify_greedy, wrong)

    right = phone_speedups()["speedup"]
    assert check_phone_speedups(lambda: dict(right)).solved
    per_step = {m: tokens(a, K) for m, a in ACCEPTANCE.items()}
    assert "tokens per step alone" in rejected(check_phone_speedups, lambda: per_step)
    by_layers = {**right, "layer_skip": per_step["layer_skip"] / (1 + K * 10 / 30)}       # the ratio of sizes
    assert "pays the per-step overhead" in rejected(check_phone_speedups, lambda: by_layers)
    swapped = {"ngram": right["layer_skip"], "layer_skip": right["ngram"]}
    assert "work out the step cost" in rejected(check_phone_speedups, lambda: swapped)
    assert "not solved yet" in unsolved(check_phone_speedups, stub)


# ---- chapter 12: a quantile from a histogram, and the panel that mixes TPOT with ITL ----------------

def test_12_monitoring():
    from minibatch.checks.monitoring import PANEL_MISTAKES, check_histogram_quantile, check_p99_tpot_panel, tpot_p99
    from minibatch.serving.monitoring import histogram_quantile

    assert check_histogram_quantile(histogram_quantile).solved
    upper_bound = lambda q, b: next(bound for bound, count in b if count >= q * b[-1][1])        # noqa: E731
    not_cumulative = lambda q, b: histogram_quantile(q, [(u, sum(c for _, c in b[:i + 1])) for i, (u, _) in
                                                         enumerate(b)])                          # noqa: E731
    inf_as_answer = lambda q, b: (float("inf") if q * b[-1][1] > b[-2][1] else histogram_quantile(q, b))  # noqa: E731
    for wrong, phrase in ((upper_bound, "upper bound of its bucket"), (not_cumulative, "already cumulative"),
                          (inf_as_answer, "highest finite bound")):
        assert phrase in rejected(check_histogram_quantile, wrong)

    assert check_p99_tpot_panel(tpot_p99).solved
    assert "inter-token latency" in unsolved(check_p99_tpot_panel, PANEL_MISTAKES["inter-token latency"][0])
    for name, phrase in (("TTFT included", "the TTFT"), ("n gaps", "n - 1 gaps"),
                         ("one-token requests as 0", "no TPOT"), ("longest gap", "max ITL"), ("mean", "mean TPOT")):
        assert phrase in rejected(check_p99_tpot_panel, PANEL_MISTAKES[name][0]), name
    assert "not solved yet" in unsolved(check_p99_tpot_panel, stub)


# ---- chapter 14: load from /metrics, and the wait of M/D/1 at 80 % load -----------------------------

def _read_load(difference=True, queue_out=True, per_request=True):
    """read_load with a planted slip: totals instead of differences, the queue kept in service, or no mean."""
    from prometheus_client.parser import text_string_to_metric_families

    def totals(text):
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    def read_load(before, after, max_batch_size):
        b, a = totals(before), totals(after)
        delta = lambda n: a.get(n, 0.0) - (b.get(n, 0.0) if difference else 0.0)   # noqa: E731
        per_step = delta("minibatch:generation_tokens_total") / delta("minibatch:iteration_tokens_total_count")
        service = delta("minibatch:e2e_request_latency_seconds_sum")
        service -= delta("minibatch:request_queue_time_seconds_sum") if queue_out else 0.0
        count = delta("minibatch:e2e_request_latency_seconds_count") if per_request else 1.0
        return {"utilisation": per_step / max_batch_size, "saturation_req_s": max_batch_size / (service / count)}
    return read_load


def test_14_serving():
    from minibatch.checks.serving import check_predict_waits, check_read_load, edge_waits

    assert check_read_load(_read_load()).solved
    for wrong, phrase in ((_read_load(difference=False), "counters only grow"),
                          (_read_load(queue_out=False), "counts the queue time as service"),
                          (_read_load(per_request=False), "mean time in service")):
        assert phrase in rejected(check_read_load, wrong)

    def md1(mean_factor=1.0, p99=None):
        def predict_waits(service_s, load):
            mean = mean_factor * load * service_s / (2 * (1 - load))
            return {"mean_wait_s": mean, "p99_wait_s": p99(mean, service_s, load) if p99 else
                    mean / load * np.log(100 * load)}
        return predict_waits

    assert check_predict_waits(md1()).solved
    assert "M/M/1" in rejected(check_predict_waits, md1(mean_factor=2.0))                      # c² = 1
    assert "long tail" in rejected(check_predict_waits, md1(p99=lambda mean, s, load: 2 * mean))
    no_load = lambda service_s, load: {"mean_wait_s": service_s / (2 * (1 - load)),            # noqa: E731
                                       "p99_wait_s": edge_waits()["p99_wait_s"]}                 # rho left out
    assert "Pollaczek-Khinchine mean" in rejected(check_predict_waits, no_load)
    assert "not solved yet" in unsolved(check_predict_waits, stub)


# ---- chapter 11: latency from timestamps, a configuration for an SLA, a policy for two classes -------

def test_11_latency_and_config():
    from minibatch.checks.sla import _pick_reference, check_latency_metrics, check_pick_config

    def latencies(tpot_of):
        def request_latencies(arrival, times):
            return times[0] - arrival, tpot_of(times), times[-1] - arrival
        return request_latencies

    right_tpot = lambda t: (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None              # noqa: E731
    percentile = lambda values, q: float(np.percentile(values, q))                              # noqa: E731
    assert check_latency_metrics(latencies(right_tpot), percentile).solved
    nearest_rank = lambda values, q: float(sorted(values)[round((len(values) - 1) * q / 100)])  # noqa: E731
    for tpot, pct, phrase in ((lambda t: (t[-1] - t[0]) / len(t), percentile, "two gaps"),       # n, not n - 1
                              (lambda t: (t[-1] - t[0]) / max(len(t) - 1, 1), percentile, "no TPOT"),
                              (right_tpot, nearest_rank, "nearest rank")):
        assert phrase in rejected(check_latency_metrics, latencies(tpot), pct)

    assert check_pick_config(_pick_reference).solved
    fastest = lambda rows, limits: max(rows, key=lambda r: r["throughput_tok_s"], default=None)        # noqa: E731
    strict = lambda rows, limits: _pick_reference(rows, {k: v - 1e-9 for k, v in limits.items()})      # noqa: E731
    last_of_equals = lambda rows, limits: _pick_reference(rows[::-1], limits)                           # noqa: E731
    for wrong, phrase in ((fastest, "only rows within every limit"), (strict, "equal to the limit"),
                          (last_of_equals, "the first in the list wins")):
        assert phrase in rejected(check_pick_config, wrong)


def test_11_policy_lab():
    from dataclasses import replace

    from minibatch.checks.policies import check_policy_lab

    assert check_policy_lab(lambda base: replace(base, scheduling_policy="shortest_prompt",
                                                 aging_tokens_per_s=200.0)).solved
    assert "chats wait behind" in rejected(check_policy_lab, lambda base: base)                              # fcfs
    shortest = lambda aging: lambda base: replace(base, scheduling_policy="shortest_prompt",                 # noqa: E731
                                                  aging_tokens_per_s=aging)
    assert "only after 10 s of waiting" in rejected(check_policy_lab, shortest(100.0))      # the default aging
    assert "lower it" in rejected(check_policy_lab, shortest(300.0))                        # the chapter's aging
    assert "a chat of 60 tokens loses" in rejected(check_policy_lab, shortest(0.0))         # no aging
    assert "prefill its whole prompt again" in rejected(check_policy_lab,
                                                        lambda base: replace(base, scheduling_policy="priority"))
    assert "only scheduling_policy" in rejected(check_policy_lab, lambda base: replace(base, max_batch_size=64))
    assert "not solved yet" in unsolved(check_policy_lab, stub)
