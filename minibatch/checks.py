"""Exercise checkers: run the learner's function on known cases and say how it went.

An exercise cell ends by handing the learner's function to its chapter's checker:

    result = check_slot_of(slot_of)

- while the function still raises NotImplementedError (the stub), the checker prints "not solved
  yet" and returns CheckResult(solved=False), raising nothing, so the notebook keeps running;
- a wrong answer raises AssertionError naming the input, the expected value and what came back;
- when every case is right it prints a success line and returns CheckResult(solved=True).

A checker is a function decorated with `@checker(title)`: it receives the learner's function(s),
compares answers with `check_cases` (or plain `assert cond, message`) and may return how many
cases it ran. The infrastructure comes first; chapter checkers follow, one section per chapter.
"""

import functools
import math
import reprlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch


@dataclass(frozen=True)
class CheckResult:
    solved: bool  # True once every case passed
    message: str  # the line printed for the learner


@dataclass(frozen=True)
class Case:
    args: tuple  # positional arguments for the learner's function
    expected: Any  # the right answer
    kwargs: dict = field(default_factory=dict)  # keyword arguments, if any


def checker(title: str) -> Callable:
    """Decorator turning a checking function into a learner-facing checker named `title`."""

    def decorate(body: Callable) -> Callable[..., CheckResult]:
        @functools.wraps(body)
        def run(*answers, **options) -> CheckResult:
            try:
                cases = body(*answers, **options)
            except NotImplementedError:
                message = (f"{title}: not solved yet. Replace `raise NotImplementedError(...)` "
                           "with your code and run the cell again.")
                print("○ " + message)
                return CheckResult(False, message)
            except AssertionError as err:
                raise AssertionError(f"{title}: {err}") from None
            message = f"{title}: all {cases} cases pass." if cases else f"{title}: solved."
            print("✓ " + message)
            return CheckResult(True, message)

        return run

    return decorate


def check_cases(fn: Callable, cases: list[Case], equal: Callable | None = None) -> int:
    """Call fn on every case; raise AssertionError at the first wrong answer. Returns len(cases)."""
    equal = equal or same_value
    for case in cases:
        call = describe_call(fn, case.args, case.kwargs)  # before the call, which may mutate args
        got = fn(*case.args, **case.kwargs)
        if not equal(got, case.expected):
            raise AssertionError(f"wrong answer\n  input:    {call}\n"
                                 f"  expected: {describe(case.expected)}\n  got:      {describe(got)}")
    return len(cases)


def same_value(got: Any, expected: Any) -> bool:
    """Equality for answers: floats to a relative 1e-5, tensors and arrays element-wise with
    their shapes, lists and tuples interchangeably, dicts key by key."""
    got, expected = _as_numpy(got), _as_numpy(expected)
    if isinstance(got, (np.ndarray, np.generic)) or isinstance(expected, (np.ndarray, np.generic)):
        got, expected = np.asarray(got), np.asarray(expected)
        if got.shape != expected.shape:
            return False
        if np.issubdtype(got.dtype, np.floating) or np.issubdtype(expected.dtype, np.floating):
            return bool(np.allclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True))
        return bool(np.array_equal(got, expected))
    if isinstance(expected, float) or isinstance(got, float):
        return (isinstance(got, (int, float, np.number)) and not isinstance(got, bool)
                and math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6))
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(same_value(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(same_value(got[k], expected[k]) for k in expected))
    return bool(got == expected)


def _as_numpy(value: Any) -> Any:
    """Tensors become numpy arrays (bfloat16 and friends via float32); anything else is kept."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.is_floating_point() else value).numpy()
    return value


_short = reprlib.Repr()  # reprlib's limits, a little roomier for messages
_short.maxlist = _short.maxtuple = 12
_short.maxstring, _short.maxother = 80, 120


def describe(value: Any) -> str:
    """A short repr for messages: large arrays and tensors by shape and dtype."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and np.prod(value.shape) > 16:
        return f"{type(value).__name__}(shape={tuple(value.shape)}, dtype={value.dtype})"
    return _short.repr(value)


def describe_call(fn: Callable, args: tuple, kwargs: dict) -> str:
    """`name(arg, ..., key=value)` for messages."""
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return f"{getattr(fn, '__name__', 'your function')}({', '.join(parts)})"


# ---- chapter 02: static batching -------------------------------------------------------------

@dataclass(frozen=True)
class Queued:
    """A waiting request, as the static batcher sees it."""

    request_id: int
    arrival_time: float      # seconds
    max_total_tokens: int    # prompt + max_new_tokens: the most KV room it can ever need


def _static_engine_admits(waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size):
    """Who the engine's own StaticScheduler admits in this situation (request ids, in order)."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.kv import BlockManager, blocks_for
    from minibatch.request import Request
    from minibatch.schedulers import StaticScheduler

    config = EngineConfig(model="tiny", scheduler="static", max_batch_size=max_batch_size,
                          batch_timeout_s=batch_timeout_s, block_size=block_size)
    member = Request(-1, [1], SamplingParams(max_new_tokens=1), 0.0)  # a batch member still decoding
    extra = blocks_for(member.max_total_tokens, block_size) if batch_running else 0
    scheduler = StaticScheduler(config, BlockManager(free_blocks + extra, block_size))
    if batch_running:
        scheduler.add(member)
        scheduler.schedule(member.arrival_time + batch_timeout_s)  # it forms a batch of its own
    for q in waiting:
        prompt = max(1, q.max_total_tokens - 1)
        scheduler.add(Request(q.request_id, [1] * prompt, SamplingParams(max_new_tokens=q.max_total_tokens - prompt),
                              q.arrival_time))
    before = {r.request_id for r in scheduler.running}
    scheduler.schedule(now)
    return [r.request_id for r in scheduler.running if r.request_id not in before]


def _static_cases() -> list[Case]:
    """Hand-picked situations (one per rule), then random ones; answers from the engine."""
    def queue(*specs):  # (arrival_time, max_total_tokens) per waiting request
        return [Queued(i, t, n) for i, (t, n) in enumerate(specs)]
    situations = [  # waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size
        (queue((0.0, 20), (0.1, 30), (0.2, 40)), False, 0.3, 3, 1.0, 100, 16),   # a full batch waits: start now
        (queue((0.0, 20), (0.1, 30), (0.2, 40), (0.3, 10)), False, 0.3, 3, 1.0, 100, 16),  # more than fit: first 3
        (queue((0.0, 20), (0.5, 30)), False, 0.7, 4, 1.0, 100, 16),             # not full, timeout not reached
        (queue((0.0, 20), (0.5, 30)), False, 1.0, 4, 1.0, 100, 16),             # the oldest waited the timeout
        (queue((0.0, 20), (0.1, 30)), False, 0.2, 4, 0.0, 100, 16),             # timeout 0: start at once
        (queue((0.0, 20), (0.1, 30), (0.2, 40)), True, 5.0, 3, 0.0, 100, 16),   # a batch is running: nobody joins
        (queue((0.0, 40), (0.1, 40), (0.2, 40)), False, 0.3, 3, 0.0, 6, 16),    # KV room for two (3 blocks each)
        (queue((0.0, 100), (0.1, 10)), False, 0.3, 2, 0.0, 5, 16),              # the head does not fit: nobody
        (queue(), False, 1.0, 4, 0.0, 100, 16),                                  # nobody waiting
    ]
    rng = np.random.default_rng(2)
    for _ in range(25):
        arrivals = np.sort(rng.uniform(0, 2, int(rng.integers(1, 9)))).round(2)
        waiting = queue(*[(float(t), int(rng.integers(2, 200))) for t in arrivals])
        now = round(float(arrivals[-1] + rng.uniform(0, 1.5)), 2)  # every waiting request has arrived
        situations.append((waiting, bool(rng.random() < 0.2), now, int(rng.integers(1, 7)),
                           float(rng.choice([0.0, 0.5, 1.0])), int(rng.integers(1, 40)), int(rng.choice([4, 8, 16]))))
    return [Case(s, _static_engine_admits(*s)) for s in situations]


@checker("admit_static(waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size)")
def check_admit_static(admit_static):
    return check_cases(admit_static, _static_cases())


def _engine_held_slot_steps(output_lengths, max_batch_size):
    """Held slot-steps of a static run of `tiny` with these output lengths, all arriving at once."""
    from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
    from minibatch.viz.timeline import slot_occupancy

    llm = LLM(EngineConfig(model="tiny", scheduler="static", max_batch_size=max_batch_size))
    workload = [WorkloadRequest(0.0, [3 + i, 4], SamplingParams(max_new_tokens=n, ignore_eos=True))
                for i, n in enumerate(output_lengths)]
    return slot_occupancy(llm.run(workload, use_tqdm=False))["held"]


@checker("held_slot_steps(output_lengths, max_batch_size)")
def check_held_slot_steps(held_slot_steps):
    situations = [([5, 2, 9], 3), ([5, 2, 9, 1], 2), ([4, 4, 4], 4), ([1, 7, 3, 7, 2], 3), ([10], 1),
                  ([3, 8, 2, 6, 6, 1, 9], 4)]
    return check_cases(held_slot_steps, [Case((lengths, b), _engine_held_slot_steps(lengths, b))
                                         for lengths, b in situations])


# ---- chapter 03: continuous batching ---------------------------------------------------------

@dataclass(frozen=True)
class Running:
    """A request holding a slot at the end of the last step."""

    request_id: int
    finished: bool           # it produced its last token in the last step
    num_pending: int         # tokens it computes next (1 for a decode, more for a prompt not yet prefilled)
    num_blocks: int          # KV blocks it holds (already room for its pending tokens)


@dataclass(frozen=True)
class Waiting:
    """A request in the queue, nothing of it computed yet."""

    request_id: int
    num_prompt_tokens: int


def _continuous_engine_step(running, waiting, max_batch_size, token_budget, free_blocks, block_size):
    """(leaving ids, [(joining id, tokens it computes)]) by the engine's own ContinuousScheduler."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.kv import BlockManager
    from minibatch.request import Request
    from minibatch.schedulers import ContinuousScheduler

    config = EngineConfig(model="tiny", max_batch_size=max_batch_size, max_tokens_per_step=token_budget,
                          block_size=block_size)
    blocks = BlockManager(free_blocks + sum(r.num_blocks for r in running), block_size)
    scheduler = ContinuousScheduler(config, blocks)
    members = []
    for r in running:  # each holds num_blocks blocks and has num_pending tokens left to compute
        prompt = r.num_blocks * block_size
        request = Request(r.request_id, [1] * prompt, SamplingParams(max_new_tokens=8), 0.0)
        request.num_computed_tokens = prompt - r.num_pending
        scheduler._admit(request)
        blocks.allocate(r.request_id, prompt)
        members.append((r, request))
    for w in waiting:
        scheduler.add(Request(w.request_id, [1] * w.num_prompt_tokens, SamplingParams(max_new_tokens=8), 0.0))
    for r, request in members:
        if r.finished:
            request.finish("length", 0.0)
            scheduler.finish(request)
    plan = scheduler.schedule(0.0)
    assert not plan.preempted, "checker set-up error: running requests hold all the blocks they need"
    joined = [(s.request.request_id, s.num_new_tokens) for s in plan.seqs
              if s.request.request_id in {w.request_id for w in waiting}]
    return [r.request_id for r in running if r.finished], joined


def _continuous_cases() -> list[Case]:
    """Hand-picked situations (one per rule), then random ones; answers from the engine."""
    situations = [  # running, waiting, max_batch_size, token_budget, free_blocks, block_size
        ([Running(0, False, 1, 2), Running(1, True, 1, 2)], [Waiting(2, 20), Waiting(3, 20)], 2, 512, 10, 16),
        ([Running(0, True, 1, 2), Running(1, True, 1, 2)], [Waiting(2, 20), Waiting(3, 20), Waiting(4, 5)],
         2, 512, 0, 16),                                            # leavers' blocks go to the joiners
        ([Running(0, False, 1, 2)], [Waiting(1, 100), Waiting(2, 100)], 4, 128, 20, 16),  # budget: a chunk
        ([Running(0, False, 1, 2)], [Waiting(1, 40)], 4, 512, 2, 16),  # 40 tokens need 3 blocks: wait
        ([Running(0, False, 60, 4)], [Waiting(1, 10)], 4, 60, 20, 16),  # a running prefill takes the budget
        ([], [Waiting(0, 10), Waiting(1, 10), Waiting(2, 10)], 2, 512, 50, 16),  # an empty batch fills up
        ([Running(0, False, 1, 1)], [], 4, 512, 5, 16),             # nobody waiting
    ]
    from dataclasses import replace

    rng = np.random.default_rng(3)
    for _ in range(30):
        block_size = int(rng.choice([4, 8, 16]))
        n_run = int(rng.integers(0, 6))
        running = [Running(i, bool(rng.random() < 0.4), 1 if rng.random() < 0.8 else int(rng.integers(2, 40)),
                           int(rng.integers(1, 6))) for i in range(n_run)]
        running = [replace(r, num_blocks=max(r.num_blocks, -(-r.num_pending // block_size))) for r in running]
        waiting = [Waiting(n_run + i, int(rng.integers(1, 150))) for i in range(int(rng.integers(0, 6)))]
        situations.append((running, waiting, int(rng.integers(max(1, n_run), 8)), int(rng.choice([16, 64, 256, 512])),
                           int(rng.integers(0, 30)), block_size))
    return [Case(s, _continuous_engine_step(*s)) for s in situations]


@checker("join_leave(running, waiting, max_batch_size, token_budget, free_blocks, block_size)")
def check_join_leave(join_leave):
    return check_cases(join_leave, _continuous_cases())


# ---- chapter 10: batching configuration and SLAs ---------------------------------------------

def _simulated_requests():
    """(arrival_time, token_times, the engine's RequestMetrics) of requests served on the simulated clock."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.metrics import RequestMetrics
    from minibatch.workload import Poisson, Uniform, make_workload

    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=4))
    llm.run(make_workload(24, Poisson(rate=3.0), output_len=Uniform(1, 12), seed=10), use_tqdm=False)
    return [(r.arrival_time, list(r.token_times), RequestMetrics.of(r)) for r in llm.engine.requests.values()]


@checker("request_latencies(arrival_time, token_times) and percentile(values, q)")
def check_latency_metrics(request_latencies, percentile):
    cases = [Case((0.0, [0.5]), (0.5, None, 0.5)),                     # one token: TPOT is not defined
             Case((1.0, [1.25, 1.5, 2.0]), (0.25, 0.375, 1.0)),
             Case((2.0, [2.0, 2.0]), (0.0, 0.0, 0.0))]
    cases += [Case((arrival, times), (m.ttft, m.tpot, m.e2e)) for arrival, times, m in _simulated_requests()]
    count = check_cases(request_latencies, cases)
    rng = np.random.default_rng(10)
    samples = [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0]]
    samples += [rng.exponential(1.0, int(rng.integers(2, 300))).round(4).tolist() for _ in range(6)]
    return count + check_cases(percentile, [Case((values, q), float(np.percentile(values, q)))
                                            for values in samples for q in (0, 50, 90, 99, 100)])


def _sweep_rows() -> list[dict]:
    """A small sweep on the simulated clock: one row (knobs + summary) per configuration."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.workload import Poisson, Uniform, make_workload

    workload = make_workload(40, Poisson(rate=4.0), output_len=Uniform(4, 32), seed=11)
    rows = []
    for size in (1, 2, 4, 8, 16):
        for timeout in (0.0, 0.5):
            llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=size,
                                   batch_timeout_s=timeout))
            rows.append({"max_batch_size": size, "batch_timeout_s": timeout, **llm.run(workload, use_tqdm=False).summary()})
    return rows


def _pick_reference(rows, limits):
    good = [r for r in rows if all(r[k] is not None and r[k] <= limit for k, limit in limits.items())]
    return max(good, key=lambda r: r["throughput_tok_s"]) if good else None   # max keeps the first of equals


@checker("pick_config(rows, limits)")
def check_pick_config(pick_config):
    rows = _sweep_rows()
    ttft, tpot = sorted(r["p99_ttft_s"] for r in rows), sorted(r["p99_tpot_s"] for r in rows)
    limit_sets = [{"p99_ttft_s": t, "p99_tpot_s": p} for t in (ttft[1], ttft[5], ttft[-1]) for p in (tpot[0], tpot[4], tpot[-1])]
    limit_sets += [{"p99_e2e_s": sorted(r["p99_e2e_s"] for r in rows)[3]}, {"p99_ttft_s": ttft[0] / 2}]
    cases = [Case((rows, limits), _pick_reference(rows, limits)) for limits in limit_sets]
    hand = [{"name": "a", "p99_ttft_s": 0.5, "throughput_tok_s": 10.0}, {"name": "b", "p99_ttft_s": 2.0, "throughput_tok_s": 30.0},
            {"name": "c", "p99_ttft_s": 0.9, "throughput_tok_s": 10.0}]
    cases += [Case((hand, {"p99_ttft_s": 1.0}), hand[0]),                # a and c tie: the first one
              Case((hand, {"p99_ttft_s": 2.0}), hand[1]),                # exactly at the limit meets it
              Case((hand, {"p99_ttft_s": 0.1}), None), Case(([], {"p99_ttft_s": 1.0}), None)]
    return check_cases(pick_config, cases)



# --- Chapter 08: small-model specifics ------------------------------------------------------------

@checker("overhead_share(parts)")
def check_overhead_share(overhead_share):
    """The share of a step outside the model's arithmetic, against the profiler's own answer."""
    from minibatch.profiler import MODEL_PARTS, PARTS
    from minibatch.profiler import overhead_share as reference

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


# --- Chapter 09: edge mode and speculative decoding -----------------------------------------------

@checker("expected_tokens_per_step(a, k) and speedup(a, k, draft_cost)")
def check_speculation_speedup(expected_tokens_per_step, speedup):
    """Tokens per step 1 + a + ... + a^k, and the speed-up E / (1 + k * draft_cost) when verifying
    k + 1 tokens costs one model step and drafting one token costs draft_cost steps."""
    from minibatch.speculative import expected_tokens_per_step as reference

    grid = [(a, k) for a in (0.0, 0.3, 0.6, 0.9, 1.0) for k in (1, 3, 6)]
    n = check_cases(expected_tokens_per_step, [Case((a, k), reference(a, k)) for a, k in grid])
    costs = [(a, k, c) for a, k in grid[::2] for c in (0.0, 0.05, 0.5)]
    return n + check_cases(speedup, [Case((a, k, c), reference(a, k) / (1 + k * c)) for a, k, c in costs])


@checker("verify_greedy(draft_token_ids, target_token_ids)")
def check_verify_greedy(verify_greedy):
    """Keep drafts while they equal the model's argmax, then add the model's own token: against the engine's rule."""
    from minibatch.speculative import verify_greedy as reference

    hand = [([4, 5, 6], [4, 5, 6, 7]), ([4, 5, 6], [4, 9, 6, 7]), ([4, 5, 6], [8, 5, 6, 7]), ([], [3]),
            ([2, 2], [2, 3, 2])]
    rng = np.random.default_rng(9)
    for _ in range(12):
        k = int(rng.integers(1, 6))
        target = [int(t) for t in rng.integers(0, 5, size=k + 1)]
        keep = int(rng.integers(0, k + 1))
        drafts = target[:keep] + [int(t) for t in rng.integers(0, 5, size=k - keep)]
        hand.append((drafts, target))
    return check_cases(verify_greedy, [Case((list(d), list(t)), reference(d, t)) for d, t in hand])


# ---- chapter 13: serving over HTTP ------------------------------------------------------------

def _exposition(generated: int, steps: int, service: list[tuple[float, float]]) -> str:
    """Prometheus text of a server that produced `generated` tokens in `steps` steps and finished
    requests with these (queue time, e2e) pairs, under the names /metrics serves."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    registry = CollectorRegistry()
    label = {"labelnames": ["model_name"], "registry": registry}
    Counter("minibatch:generation_tokens", "tokens", **label).labels("m").inc(generated)
    per_step = Histogram("minibatch:iteration_tokens_total", "tokens per step", **label).labels("m")
    for _ in range(steps):
        per_step.observe(1)
    queue = Histogram("minibatch:request_queue_time_seconds", "queue", **label).labels("m")
    e2e = Histogram("minibatch:e2e_request_latency_seconds", "e2e", **label).labels("m")
    for q, total in service:
        queue.observe(q)
        e2e.observe(total)
    return generate_latest(registry).decode()


def _served_with_metrics() -> list[tuple[str, str, dict]]:
    """Two runs on the simulated clock, scraped around each: (before, after, the engine's own answer)."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.monitoring import engine_metrics
    from minibatch.workload import Poisson, Uniform, make_workload

    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=4))
    metrics, out = engine_metrics(llm), []
    for rate, seed in ((2.0, 13), (40.0, 14)):
        before = metrics.exposition()
        report = llm.run(make_workload(16, Poisson(rate=rate), output_len=Uniform(2, 12), seed=seed), use_tqdm=False)
        tokens = sum(r.num_output_tokens for r in report.requests)
        service = [r.e2e - r.queue_time for r in report.requests]
        out.append((before, metrics.exposition(), {"utilisation": tokens / len(report.steps) / 4,
                                                   "saturation_req_s": 4 / float(np.mean(service))}))
    return out


@checker("read_load(before, after, max_batch_size)")
def check_read_load(read_load):
    """Utilisation (tokens per step / max_batch_size) and the saturation point (Little's law:
    max_batch_size / mean time in service) between two scrapes of /metrics."""
    empty = _exposition(0, 0, [])
    hand = [(empty, _exposition(80, 40, [(0.5, 2.5), (0.0, 1.0)]), 8, {"utilisation": 0.25, "saturation_req_s": 8 / 1.5}),
            (_exposition(10, 10, [(1.0, 3.0)]), _exposition(40, 20, [(1.0, 3.0), (0.25, 1.25), (0.75, 0.75)]), 4,
             {"utilisation": 0.75, "saturation_req_s": 4 / 0.5})]
    cases = [Case((b, a, size), expected) for b, a, size, expected in hand]
    cases += [Case((b, a, 4), expected) for b, a, expected in _served_with_metrics()]
    return check_cases(read_load, cases)


# ---- chapters 06 and 07: the KV cache, memory and paged attention ---------------------------

KV_SHAPES = [  # (name, layers, KV heads, head dim, bytes per element)
    ("SmolLM2-135M fp32", 30, 3, 64, 4), ("SmolLM2-135M bf16", 30, 3, 64, 2), ("Llama-2-7B fp16", 32, 32, 128, 2),
    ("Llama-3-8B bf16", 32, 8, 128, 2), ("Qwen2.5-0.5B bf16", 24, 2, 64, 2), ("tiny fp32", 4, 2, 16, 4),
]


def _sequences_admitted(budget_bytes, bytes_per_token, block_size, tokens_per_seq):
    """How many sequences of tokens_per_seq tokens the engine's BlockManager holds in this budget."""
    from minibatch.kv import BlockManager

    blocks = BlockManager(budget_bytes // (bytes_per_token * block_size), block_size)
    count = 0
    while blocks.can_allocate(count, tokens_per_seq):
        blocks.allocate(count, tokens_per_seq)
        count += 1
    return count


@checker("kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_element) and "
         "max_sequences(budget_bytes, bytes_per_token, block_size, tokens_per_seq)")
def check_kv_capacity(kv_bytes_per_token, max_sequences):
    """Bytes per token against the engine's formula; sequences per budget against a BlockManager filled up."""
    from minibatch.kv import kv_bytes_per_token as reference

    dtypes = {4: torch.float32, 2: torch.float16}
    n = check_cases(kv_bytes_per_token, [Case((layers, heads, dim, size), reference(layers, heads, dim, dtypes[size]))
                                         for _, layers, heads, dim, size in KV_SHAPES])
    situations = [(1 << 20, 1024, 16, 40), (1 << 20, 1024, 16, 48), (1 << 20, 1024, 16, 49), (1 << 20, 1024, 16, 2000),
                  (80 << 20, 46080, 16, 132), (80 << 20, 46080, 16, 512), (1 << 30, 524288, 16, 512),
                  (16 << 30, 524288, 16, 1000), (8 << 30, 131072, 32, 4096), (1 << 30, 23040, 1, 100), (5000, 64, 8, 3)]
    return n + check_cases(max_sequences, [Case(s, _sequences_admitted(*s)) for s in situations])


def _growth_cases():
    """(block_size, free list order, prompt tokens, tokens to append) per scenario."""
    rng = np.random.default_rng(6)
    cases = [(4, list(range(8)), 1, 10), (4, [5, 2, 7, 0, 1, 3, 6, 4], 4, 9), (16, [3, 1, 2, 0], 15, 20),
             (1, [9, 4, 6, 2, 8], 0, 5), (8, [2, 0, 1], 0, 24)]
    for _ in range(6):
        block_size, num_blocks = int(rng.choice([2, 4, 8, 16])), int(rng.integers(6, 20))
        prompt = int(rng.integers(0, 3 * block_size))
        room = num_blocks * block_size - prompt
        cases.append((block_size, rng.permutation(num_blocks).tolist(), prompt, int(rng.integers(1, room + 1))))
    return cases


@checker("append_token(block_table, num_tokens, free_blocks, block_size)")
def check_append_token(append_token):
    """Grow sequences one token at a time beside the engine's BlockManager: same slots, tables, free lists."""
    from collections import deque

    from minibatch.kv import BlockManager

    count = 0
    for block_size, order, prompt, new_tokens in _growth_cases():
        manager = BlockManager(len(order), block_size)
        manager.free_blocks = deque(order)
        if prompt:
            manager.allocate(0, prompt)
        table, free = list(manager.block_tables.get(0, [])), deque(manager.free_blocks)
        for num_tokens in range(prompt, prompt + new_tokens):
            before = f"append_token({table}, {num_tokens}, deque({list(free)}), {block_size})"
            manager.allocate(0, num_tokens + 1)
            expected = (manager.slot(0, num_tokens), manager.block_tables[0], list(manager.free_blocks))
            slot = append_token(table, num_tokens, free, block_size)
            got = (slot, table, list(free))
            assert same_value(got, expected), (
                f"wrong answer\n  call:     {before}\n  expected: slot {expected[0]}, block_table {expected[1]}, "
                f"free_blocks {expected[2]}\n  got:      slot {got[0]}, block_table {got[1]}, free_blocks {got[2]}")
            count += 1
    return count


def _decode_case(seed, block_size, num_kv_heads, group, head_dim, context_len):
    """Random caches with the sequence's blocks shuffled among spare ones, and one decode query."""
    rng = np.random.default_rng(seed)
    needed = -(-context_len // block_size)
    num_blocks = needed + 3
    table = rng.permutation(num_blocks)[:needed].tolist()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    query = (2 * rng.standard_normal((num_kv_heads * group, head_dim))).astype(np.float32)
    return query, k_cache, v_cache, table, context_len, float(head_dim ** -0.5)


def _reference_decode(query, k_cache, v_cache, block_table, context_len, scale):
    """The torch reference backend on a batch of one decoding sequence; (Hq, D) numpy."""
    from minibatch.kernels import AttentionMetadata, get_backend

    meta = AttentionMetadata.build([1], [context_len], [block_table], "cpu")
    out = get_backend("torch").attention(torch.from_numpy(query)[None], torch.from_numpy(k_cache),
                                         torch.from_numpy(v_cache), meta, scale)
    return out[0].numpy()


@checker("paged_decode_attention(query, k_cache, v_cache, block_table, context_len, scale)")
def check_paged_decode_attention(paged_decode_attention):
    """One decoding sequence over a paged cache, against the torch reference backend (fp32, 1e-4)."""
    shapes = [(4, 1, 1, 8, 1), (4, 1, 1, 8, 4), (4, 1, 1, 8, 6), (1, 2, 2, 8, 5), (16, 3, 3, 64, 37),
              (8, 2, 4, 32, 64), (32, 1, 3, 16, 33), (16, 3, 3, 64, 200)]
    cases = [Case(_decode_case(seed, *shape), None) for seed, shape in enumerate(shapes)]
    cases = [Case(c.args, _reference_decode(*c.args)) for c in cases]
    close = lambda got, want: (np.shape(got) == want.shape  # noqa: E731
                               and np.allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-4, atol=1e-4))
    return check_cases(paged_decode_attention, cases, equal=close)


# ---- chapter 04: throughput versus latency ---------------------------------------------------

def _engine_timeout_rule(arrivals, now, max_batch_size, batch_timeout_s):
    """(batch_ready(now), wake_time()) of the engine's own Scheduler with requests waiting since `arrivals`."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.kv import BlockManager
    from minibatch.request import Request
    from minibatch.schedulers import Scheduler

    config = EngineConfig(model="tiny", max_batch_size=max_batch_size, batch_timeout_s=batch_timeout_s)
    scheduler = Scheduler(config, BlockManager(1, 16))
    for i, t in enumerate(arrivals):
        scheduler.add(Request(i, [1], SamplingParams(), t))
    return (scheduler.batch_ready(now) if arrivals else None), scheduler.wake_time()


def _timeout_situations() -> list[tuple]:
    """(arrivals, now, max_batch_size, batch_timeout_s): one per rule, then random ones."""
    situations = [([0.0, 0.1, 0.2], 0.2, 3, 1.0),         # a full batch waits: start now
                  ([0.0, 0.1, 0.2, 0.3], 0.3, 2, 5.0),    # more than a full batch
                  ([0.0, 0.5], 0.7, 4, 1.0),              # not full, the oldest has waited 0.7 s of 1 s
                  ([0.0, 0.5], 1.0, 4, 1.0),              # the oldest has waited exactly the timeout
                  ([2.0, 2.5], 2.9, 8, 1.0),              # the clock is not at zero
                  ([0.3], 0.3, 8, 0.0),                   # timeout 0: start at once
                  ([0.7], 0.7 + 0.1, 8, 0.1)]             # the deadline itself, as a float: 0.7 + 0.1
    rng = np.random.default_rng(4)
    for _ in range(30):
        arrivals = np.sort(rng.uniform(0, 3, int(rng.integers(1, 7)))).round(2).tolist()
        timeout = float(rng.choice([0.0, 0.05, 0.1, 0.3, 0.7, 1.0]))
        now = arrivals[0] + timeout if rng.random() < 0.4 else round(arrivals[-1] + float(rng.uniform(0, 1.2)), 2)
        situations.append((arrivals, max(now, arrivals[-1]), int(rng.integers(1, 6)), timeout))
    return situations


def _serve_with_rule(scheduler: str, batch_ready=None, wake_time=None) -> list[tuple]:
    """(first token time, finish time) per request of a simulated run of `tiny`, with the engine's
    timeout rule, or with the given functions in its place."""
    from minibatch.config import EngineConfig
    from minibatch.distributions import Poisson, Uniform
    from minibatch.llm import LLM
    from minibatch.workload import make_workload

    llm = LLM(EngineConfig(model="tiny", scheduler=scheduler, clock="simulated", sim_skip_model=True,
                           max_batch_size=4, batch_timeout_s=0.3))
    engine, sched = llm.engine, llm.engine.scheduler
    if batch_ready is not None:
        arrivals = lambda: [r.arrival_time for r in sched.waiting]
        sched.batch_ready = lambda now: batch_ready(arrivals(), now, sched.max_batch_size, sched.batch_timeout_s)
        sched.wake_time = lambda: wake_time(arrivals(), sched.batch_timeout_s)
        sleep, naps = engine.clock.sleep_until, []

        def guarded_sleep(t):           # an idle engine whose rule never fires would wait forever
            naps.append(t)
            assert len(naps) < 5000, (f"with your functions the idle engine never starts its batch: it woke at "
                                      f"{t!r} and found batch_ready False again and again")
            sleep(t)
        engine.clock.sleep_until = guarded_sleep
    llm.run(make_workload(30, arrival=Poisson(3.0), output_len=Uniform(2, 10), seed=4), use_tqdm=False)
    return [(r.first_token_time, r.finish_time) for r in engine.requests.values()]


@checker("batch_ready(arrivals, now, max_batch_size, batch_timeout_s) and wake_time(arrivals, batch_timeout_s)")
def check_batch_timeout(batch_ready, wake_time):
    situations = _timeout_situations()
    count = check_cases(batch_ready, [Case(s, _engine_timeout_rule(*s)[0]) for s in situations])
    wakes = [([], 0.5)] + [(s[0], s[3]) for s in situations[::3]]
    count += check_cases(wake_time, [Case(w, _engine_timeout_rule(w[0], 0.0, 1, w[1])[1]) for w in wakes])
    for scheduler in ("static", "continuous"):
        expected, got = _serve_with_rule(scheduler), _serve_with_rule(scheduler, batch_ready, wake_time)
        wrong = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
        assert not wrong, (f"serving a workload with scheduler={scheduler!r}, max_batch_size=4, batch_timeout_s=0.3 "
                           f"and your rule, request {wrong[0]} got (first token, finish) at {got[wrong[0]]}; "
                           f"the engine's rule gives {expected[wrong[0]]}")
        count += 1
    return count


# ---- chapter 11: monitoring ------------------------------------------------------------------

def _served_histograms() -> list[list[tuple[float, float]]]:
    """Cumulative buckets of the TTFT, TPOT and e2e histograms of a simulated run of `tiny`."""
    from minibatch.config import EngineConfig
    from minibatch.distributions import Poisson, Uniform
    from minibatch.llm import LLM
    from minibatch.monitoring import exposition, histogram_buckets
    from minibatch.workload import make_workload

    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=8))
    llm.run(make_workload(60, arrival=Poisson(20.0), output_len=Uniform(2, 40), seed=11), use_tqdm=False)
    text = exposition(llm)
    return [histogram_buckets(text, f"minibatch:{name}") for name in
            ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds")]


@checker("histogram_quantile(q, buckets)")
def check_histogram_quantile(histogram_quantile):
    from minibatch.monitoring import histogram_quantile as reference

    inf = float("inf")
    hand = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (inf, 10.0)]
    cases = [Case((0.5, hand), 0.4),            # rank 5 lies in (0.1, 0.5]: 0.1 + 0.4 * (5 - 2) / (6 - 2)
             Case((0.1, hand), 0.05),           # rank 1 in the first bucket, which starts at 0
             Case((0.8, hand), 1.0),            # rank 8 is exactly the count up to 1.0
             Case((0.99, hand), 1.0),           # rank 9.9 is in the +inf bucket: the highest finite bound
             Case((0.5, [(1.0, 0.0), (2.0, 4.0), (inf, 4.0)]), 1.5)]   # an empty first bucket
    cases += [Case((q, buckets), reference(q, buckets)) for buckets in _served_histograms() for q in (0.5, 0.9, 0.99)]
    return check_cases(histogram_quantile, cases)
