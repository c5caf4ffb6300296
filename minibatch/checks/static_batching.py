"""Chapter 02 (static batching): the static batcher's admission rule and the slot-steps that finished requests hold."""

from dataclasses import dataclass

import numpy as np

from minibatch.checks.core import Case, check_cases, checker, describe_call, same_value


@dataclass(frozen=True)
class Queued:
    """A waiting request, as the static batcher sees it."""

    request_id: int
    arrival_time: float      # seconds
    max_total_tokens: int    # prompt + max_new_tokens: the most KV room it can ever need


def _static_engine_admits(waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size):
    """Who the engine's own StaticScheduler admits in this situation (request ids, in order)."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.engine.kv import BlockManager, blocks_for
    from minibatch.engine.request import Request
    from minibatch.engine.schedulers import StaticScheduler

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


def _admission_symptom(case: Case, got) -> str | None:
    """What a wrong admission would look like in the engine, in the words of the chapter's slot timeline."""
    waiting, running, now, max_batch_size, timeout, free_blocks, block_size = case.args
    expected, got = list(case.expected), list(got) if isinstance(got, (list, tuple)) else got
    if not isinstance(got, list):
        return None
    ids = [q.request_id for q in waiting]
    if running and got:
        return (f"requests {got} joined while a batch was running: in the slot timeline they start in the middle "
                "of the batch, beside members still decoding. That is continuous batching's rule; a static batch "
                "admits nobody until its longest member has finished")
    if not expected and got and len(waiting) < max_batch_size and now < waiting[0].arrival_time + timeout:
        return (f"a batch of {got} started at now={now}, but it is not full ({len(waiting)} of {max_batch_size}) and "
                f"the oldest request has waited {now - waiting[0].arrival_time:.2f} s of batch_timeout_s={timeout}")
    if expected and not got:
        waited = now - waiting[0].arrival_time
        why = (f"the oldest request has waited {waited:.2f} s, batch_timeout_s={timeout}" if waited >= timeout
               else f"{len(waiting)} requests wait for {max_batch_size} slots")
        return f"nobody was admitted, but a batch is ready ({why}): idle slots while requests wait"
    order = [ids.index(i) for i in got if i in ids]
    if order != list(range(len(order))):
        return (f"you admitted {got} from the queue {ids}: a request that does not fit stops admission, nobody "
                "behind it overtakes (a long request would otherwise wait for ever)")
    if len(got) > len(expected):
        extra = waiting[len(expected)]
        return (f"request {extra.request_id} may need {extra.max_total_tokens} tokens, "
                f"{-(-extra.max_total_tokens // block_size)} blocks of {block_size}, but only {free_blocks} blocks "
                "were free for the whole batch: a static batch never preempts, so every member's worst case must "
                "fit up front, in whole blocks")
    return None


def _serve_static_with(admit_static=None) -> list[tuple]:
    """(first token time, finish time) per request of a simulated static run of `tiny` (3 slots, a 0.3 s timeout,
    a small KV pool), with the engine's admission rule or with `admit_static` in its place."""
    from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest

    llm = LLM(EngineConfig(model="tiny", scheduler="static", clock="simulated", sim_skip_model=True, max_batch_size=3,
                           batch_timeout_s=0.3, block_size=4, num_kv_blocks=40))
    sched = llm.engine.scheduler
    if admit_static is not None:
        def form_batch(now):
            queue = list(sched.waiting)
            ids = admit_static([Queued(r.request_id, r.arrival_time, r.max_total_tokens) for r in queue],
                               bool(sched.running), now, sched.max_batch_size, sched.batch_timeout_s,
                               sched.blocks.num_free_blocks, sched.blocks.block_size)
            if not ids and queue and not sched.running and now >= sched.wake_time():
                raise AssertionError(
                    f"serving a workload with your rule, at {now!r} s the oldest request had waited since "
                    f"{queue[0].arrival_time!r} s, batch_timeout_s={sched.batch_timeout_s} ago, and nothing was "
                    "running, yet your rule started no batch; the engine would wait for ever. If you test "
                    "`now - arrival >= timeout`, floating point can make the difference fall just short at the "
                    "deadline itself: compare `now >= arrival + timeout`, the time the engine wakes at")
            assert len(ids) <= len(sched._free_slots), (
                f"serving a workload with your rule, at {now:.2f} s it admitted {list(ids)} while {len(sched.running)} "
                f"of {sched.max_batch_size} slots were taken: the batch would hold more sequences than slots")
            for request_id in ids:
                request = next(r for r in queue if r.request_id == request_id)
                sched.admit(request)
                sched._start_after_prefix(request, [])
        sched._form_batch = form_batch
    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(0.25, 24))                 # about 4 requests a second
    workload = [WorkloadRequest(float(t), rng.integers(3, 200, int(rng.integers(4, 40))).tolist(),
                                SamplingParams(max_new_tokens=int(rng.integers(2, 13)), ignore_eos=True))
                for t in arrivals]                                   # each needs 2 to 13 blocks of 4 tokens
    llm.run(workload, use_tqdm=False)
    return [(r.first_token_time, r.finish_time) for r in llm.engine.requests.values()]


@checker("admit_static(waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size)",
         debug=True)
def check_admit_static(admit_static):
    """Debugging exercise: the learner's admission rule against the engine's StaticScheduler, with the symptom."""
    cases = _static_cases()
    for case in cases:
        got = admit_static(*case.args)
        if not same_value(got, case.expected):
            symptom = _admission_symptom(case, got)
            if symptom:
                raise AssertionError(f"{describe_call(admit_static, case.args, {})}:\n  {symptom}")
    count = check_cases(admit_static, cases)
    expected, got = _serve_static_with(), _serve_static_with(admit_static)   # the rule inside the engine
    wrong = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    assert not wrong, (f"serving 24 requests with your rule in the engine's StaticScheduler (3 slots, "
                       f"batch_timeout_s=0.3, 40 KV blocks of 4 tokens), request {wrong[0]} got (first token, "
                       f"finish) at {got[wrong[0]]}; the engine's rule gives {expected[wrong[0]]}")
    return count + 1


def _engine_held_slot_steps(output_lengths, max_batch_size):
    """Held slot-steps of a static run of `tiny` with these output lengths, all arriving at once."""
    from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
    from minibatch.viz.timeline import slot_occupancy

    llm = LLM(EngineConfig(model="tiny", scheduler="static", max_batch_size=max_batch_size))
    workload = [WorkloadRequest(0.0, [3 + i, 4], SamplingParams(max_new_tokens=n, ignore_eos=True))
                for i, n in enumerate(output_lengths)]
    return slot_occupancy(llm.run(workload, use_tqdm=False))["held"]


def _batches(lengths, size):
    return [lengths[i:i + size] for i in range(0, len(lengths), size)]


# The usual wrong turns (output_lengths, max_batch_size -> a count), each with what the timeline shows instead.
HELD_MISTAKES = {
    "counts the empty slots of a short last batch as held": (
        lambda n, b: sum(sum(max(x) - k for k in x) + (b - len(x)) * max(x) for x in _batches(n, b)),
        "a slot no request occupies is idle, not held: only a request that has finished holds its slot"),
    "sorts the requests by length before batching": (
        lambda n, b: sum(sum(max(x) - k for k in x) for x in _batches(sorted(n), b)),
        "the static batcher takes requests in arrival order; sorting by length is a different scheduler"),
    "puts every request in one batch": (
        lambda n, b: sum(max(n) - k for k in n),
        "a batch holds at most max_batch_size requests; the next batch starts when the longest member ends"),
    "counts one step too many per finished request": (
        lambda n, b: sum(sum(max(x) - k + 1 for k in x if k < max(x)) for x in _batches(n, b)),
        "a request of n tokens computes in n steps (its prefill makes the first token), so in a batch whose "
        "longest member takes m steps it holds its slot for m - n steps"),
}


@checker("held_slot_steps(output_lengths, max_batch_size)")
def check_held_slot_steps(held_slot_steps):
    situations = [([5, 2, 9], 3), ([5, 2, 9, 1], 2), ([4, 4, 4], 4), ([1, 7, 3, 7, 2], 3), ([10], 1),
                  ([3, 8, 2, 6, 6, 1, 9], 4)]
    cases = [Case((lengths, b), _engine_held_slot_steps(lengths, b)) for lengths, b in situations]
    for case in cases:
        got = held_slot_steps(list(case.args[0]), case.args[1])
        for mistake, (wrong, advice) in HELD_MISTAKES.items():
            if got != case.expected and got == wrong(*case.args):
                raise AssertionError(f"on output_lengths={case.args[0]}, max_batch_size={case.args[1]} your function "
                                     f"{mistake} ({got} instead of the timeline's {case.expected}): {advice}")
    return check_cases(held_slot_steps, cases)
