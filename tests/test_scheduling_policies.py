"""Scheduling policies ("fcfs", "priority", "shortest_prompt") and the per-request prefill cap.

Correct: greedy tokens equal transformers' generate() under every policy, with priority
preemption forced by too few slots or too few KV blocks. Invariants (hypothesis, model stubbed):
under "priority" no waiting request ranks ahead of one being admitted and the victim of every
preemption is the worst-ranked running request; the cap is never exceeded per request per step;
every request finishes exactly once and every block is free at the end. Fairness, on the simulated
clock: with aging a long prompt's wait is bounded under a steady stream of short ones; without
aging it starves for as long as the stream lasts.
"""
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.checks import check_policy_lab
from minibatch.llm import make_engine
from tests.conftest import reference_greedy
from tests.test_engine_correctness import NEW, PROMPTS
from tests.test_scheduler_properties import StubRunner


@pytest.fixture(scope="module")
def references(tiny_hf):
    model, _ = tiny_hf
    return [reference_greedy(model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("policy", ["fcfs", "priority", "shortest_prompt"])
@pytest.mark.parametrize("max_batch_size,num_kv_blocks,cap", [(2, 256, 0), (6, 32, 0), (4, 256, 5), (3, 40, 8)])
def test_greedy_matches_generate_under_each_policy(references, policy, max_batch_size, num_kv_blocks, cap):
    llm = LLM(EngineConfig(model="tiny", scheduling_policy=policy, max_batch_size=max_batch_size, block_size=4,
                           num_kv_blocks=num_kv_blocks, max_tokens_per_step=64, long_prefill_token_threshold=cap))
    priorities = [(i * 2) % 3 if policy == "priority" else 0 for i in range(len(PROMPTS))]
    outs = llm.generate(PROMPTS, [SamplingParams(max_new_tokens=NEW, priority=p) for p in priorities], use_tqdm=False)
    assert [o.token_ids for o in outs] == references
    assert llm.engine.blocks.num_free_blocks == num_kv_blocks
    if cap:
        assert max(s.num_prefill_tokens for s in llm.engine.step_records) <= cap * max_batch_size


@pytest.mark.parametrize("policy", ["priority", "shortest_prompt"])
def test_policies_with_prefix_caching_match_generate(tiny_hf, policy):
    """Prompts sharing a prefix, a pool small enough to preempt, a prefill cap: the cache, the policy and
    the cap together still give generate()'s tokens."""
    model, _ = tiny_hf
    shared = list(range(30, 62))
    prompts = [shared + [5 + i] * (3 + 7 * i) for i in range(5)]
    llm = LLM(EngineConfig(model="tiny", scheduling_policy=policy, enable_prefix_caching=True, max_batch_size=3,
                           block_size=4, num_kv_blocks=40, long_prefill_token_threshold=8))
    priorities = [2, 0, 1, 0, 2] if policy == "priority" else [0] * 5
    outs = llm.generate(prompts, [SamplingParams(max_new_tokens=16, priority=p) for p in priorities], use_tqdm=False)
    assert [o.token_ids for o in outs] == [reference_greedy(model, p, 16) for p in prompts]
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "the pool was meant to force preemption"
    assert sum(o.metrics.num_cached_tokens for o in outs) > 0, "the shared prefix was meant to be reused"


@pytest.mark.parametrize("short_of, config", [("slots", dict(max_batch_size=2)),
                                              ("blocks", dict(max_batch_size=6, num_kv_blocks=30))])
def test_priority_preempts_lower_ranked_running_requests(references, short_of, config):
    """Low-priority requests run; high-priority ones arrive and take their place at once (vLLM's forced
    preemption); the preempted recompute, and every token still equals generate()'s."""
    engine = LLM(EngineConfig(model="tiny", scheduling_policy="priority", block_size=4, **config)).engine
    low = [engine.add_request(p, SamplingParams(max_new_tokens=NEW, priority=1)) for p in PROMPTS[:3]]
    for _ in range(4):
        engine.step()
    step_added = len(engine.step_records)
    high = [engine.add_request(p, SamplingParams(max_new_tokens=NEW, priority=0)) for p in PROMPTS[3:]]
    while engine.has_unfinished():
        engine.step()
    assert [r.output_token_ids for r in low + high] == references
    assert sum(r.num_preemptions for r in low) > 0 and high[0].num_preemptions == 0
    first_step = {rid for rid, _ in engine.step_records[step_added].slots.values()}
    assert high[0].request_id in first_step, "the best waiting request did not start at once"
    assert engine.step_records[step_added].num_preempted > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


class Watched(StubRunner):
    """The stub runner, also checking the prefill cap on every scheduled sequence."""

    def __init__(self, engine, cap):
        super().__init__(engine)
        self.cap = cap

    def execute(self, plan):
        for seq in plan.seqs:
            if self.cap and seq.is_prefill:
                assert seq.num_new_tokens <= self.cap, "a request prefilled more than the cap in one step"
        return super().execute(plan)


def watch_priority_choices(scheduler):
    """Wrap the scheduler's admit and preempt: check each against the priority order as it happens."""
    admit, preempt, policy = scheduler._admit, scheduler._preempt, scheduler.policy

    def checked_admit(request):
        better = [w for w in scheduler.waiting if policy.rank(w, 0.0) < policy.rank(request, 0.0)]
        assert not better, f"request {request.request_id} admitted while better-ranked {better[0].request_id} waited"
        admit(request)

    def checked_preempt(request, plan):
        worst = max(policy.rank(r, 0.0) for r in scheduler.running)
        assert policy.rank(request, 0.0) == worst, "the victim is not the worst-ranked running request"
        preempt(request, plan)

    scheduler._admit, scheduler._preempt = checked_admit, checked_preempt


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(-2, 2), st.integers(0, 3)),
                      min_size=1, max_size=14),
    policy=st.sampled_from(["fcfs", "priority", "shortest_prompt"]),
    scheduler=st.sampled_from(["continuous", "edge"]),
    max_batch_size=st.integers(1, 6),
    budget=st.integers(1, 64),
    cap=st.sampled_from([0, 1, 3, 8, 32]),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 30),
    aging=st.sampled_from([0.0, 50.0, 1e4]),
)
def test_policy_invariants(requests, policy, scheduler, max_batch_size, budget, cap, block_size, spare_blocks, aging):
    """Requests (prompt, new tokens, priority, step it arrives at) under each policy: the priority order
    holds at every admission and preemption, the cap holds, all finish once, every block is free."""
    worst = max(-(-(p + n) // block_size) for p, n, _, _ in requests)
    config = EngineConfig(model="tiny", scheduler=scheduler, scheduling_policy=policy, max_batch_size=max_batch_size,
                          max_tokens_per_step=budget, long_prefill_token_threshold=cap, block_size=block_size,
                          num_kv_blocks=worst + spare_blocks, aging_tokens_per_s=aging, max_model_len=96)
    engine = make_engine(config)
    engine.runner = Watched(engine, cap)
    if policy == "priority":
        watch_priority_choices(engine.scheduler)
    added, finished = [], []
    for step in range(10_000):
        for p, n, priority, at in requests:
            if at == step:
                priority = priority if policy == "priority" else 0
                params = SamplingParams(max_new_tokens=n, ignore_eos=True, priority=priority)
                added.append(engine.add_request(list(range(1, p + 1)), params))
        if len(added) == len(requests) and not engine.has_unfinished():
            break
        done = engine.step()
        assert done is not None or len(added) < len(requests), "the engine stalled with work left"
        finished.extend(done or [])
        record = engine.step_records[-1] if done is not None else None
        assert record is None or record.num_prefill_tokens + record.num_decode_tokens <= budget
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in added), "each finishes exactly once"
    assert all(r.output_token_ids == [3] * r.params.max_new_tokens for r in added)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks and not engine.blocks.block_tables


# ---- fairness on the simulated clock: a long prompt among a steady stream of short ones ---------

def stream(num_short, short_len, short_new, gap_s, long_len, long_at_s):
    """Short requests every gap_s seconds, and one long prompt arriving at long_at_s (the last in the list)."""
    shorts = [WorkloadRequest(i * gap_s, [7] * short_len, SamplingParams(max_new_tokens=short_new, ignore_eos=True))
              for i in range(num_short)]
    return shorts + [WorkloadRequest(long_at_s, [9] * long_len, SamplingParams(max_new_tokens=4, ignore_eos=True))]


def serve_stream(workload, aging):
    """Serve on one slot with shortest-prompt-first; returns the engine. On the fixed reference machine
    (`reference-cpu`), where a short of a few tokens takes longer than the stream's gap (a few hundredths of a
    second), so the queue always holds shorts."""
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=1,
                           scheduling_policy="shortest_prompt", aging_tokens_per_s=aging,
                           sim_profile="reference-cpu"))
    llm.run(workload, use_tqdm=False)
    return llm.engine


def steps_before_first_scheduled(engine, request) -> int:
    return sum(1 for record in engine.step_records if record.start < request.first_scheduled_time)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(short_len=st.integers(1, 24), short_new=st.integers(1, 6), long_len=st.integers(40, 400),
       aging=st.floats(20.0, 3000.0), gap_s=st.floats(0.005, 0.05), long_at=st.integers(0, 20))
def test_aging_bounds_the_wait_of_a_long_prompt(short_len, short_new, long_len, aging, gap_s, long_at):
    """A long prompt of L tokens ranks ahead of every short (s tokens) arriving more than (L - s) / aging
    seconds after it: it waits at most for the shorts that came before that, whatever follows."""
    workload = stream(150, short_len, short_new, gap_s, long_len, long_at * gap_s)
    engine = serve_stream(workload, aging)
    requests = sorted(engine.requests.values(), key=lambda r: r.request_id)
    long = next(r for r in requests if len(r.prompt_token_ids) == long_len)
    assert all(r.is_finished for r in requests) and engine.blocks.num_free_blocks == engine.blocks.num_blocks
    overtaken_until = long.arrival_time + (long_len - short_len) / aging
    ahead = [r for r in requests if r is not long and r.arrival_time <= overtaken_until + 1e-9]
    bound = sum(r.params.max_new_tokens for r in ahead)      # one slot: a short takes one step per token
    assert steps_before_first_scheduled(engine, long) <= bound


def test_without_aging_a_long_prompt_starves_while_the_stream_lasts():
    """Shortest-prompt-first without aging: the long prompt waits for every short of the stream, so its
    wait grows with the stream's length; with aging its wait is the same whatever the stream's length."""
    waits = {}
    for aging in (0.0, 600.0):
        for num_short in (40, 80):
            engine = serve_stream(stream(num_short, 8, 3, 0.02, 200, 0.1), aging)
            long = max(engine.requests.values(), key=lambda r: len(r.prompt_token_ids))
            shorts = [r for r in engine.requests.values() if r is not long]
            waits[aging, num_short] = steps_before_first_scheduled(engine, long)
            if aging == 0.0:
                assert all(r.first_scheduled_time < long.first_scheduled_time for r in shorts), "it did not starve"
    assert waits[0.0, 80] >= waits[0.0, 40] + 40 * 3          # every extra short (3 steps each) came first
    assert waits[600.0, 80] == waits[600.0, 40] < waits[0.0, 40]


# ---- the open lab's checker (chapter 11, exercise 3) ------------------------------------------

@pytest.mark.parametrize("answer, words", [
    (lambda base: replace(base, scheduling_policy="priority"), ["document: p99 TTFT", "over the limit of 12 s"]),
    (lambda base: base, ["scheduling_policy='fcfs' misses", "chat: p99 TTFT", "over the limit of 6 s"]),
    (lambda base: replace(base, scheduling_policy="shortest_prompt", aging_tokens_per_s=0.0), ["chat: p99 TTFT"]),
    (lambda base: replace(base, scheduling_policy="shortest_prompt", max_batch_size=64), ["max_batch_size changed"]),
    (lambda base: "shortest_prompt", ["must return an EngineConfig", "'shortest_prompt'"]),
    (lambda base: replace(base, aging_tokens_per_s=-1.0), ["refuses", "aging_tokens_per_s=-1.0"]),
])
def test_policy_lab_checker_catches_planted_mistakes(answer, words):
    with pytest.raises(AssertionError) as err:
        check_policy_lab(answer)
    for word in words:
        assert word in str(err.value)


def test_policy_lab_has_an_answer_and_fcfs_and_priority_each_miss_a_class():
    from minibatch.tools.fairness import LAB_BASE, LAB_LIMITS, lab_score
    assert check_policy_lab(lambda base: replace(base, scheduling_policy="shortest_prompt",
                                                 aging_tokens_per_s=200.0)).solved
    fcfs, priority = lab_score(LAB_BASE), lab_score(replace(LAB_BASE, scheduling_policy="priority"))
    assert fcfs["chat"]["p99_ttft_s"] > LAB_LIMITS["chat"] >= priority["chat"]["p99_ttft_s"]
    assert priority["document"]["p99_ttft_s"] > LAB_LIMITS["document"] >= fcfs["document"]["p99_ttft_s"]


def test_mixed_workload_refuses_a_rush_outside_its_duration():
    from minibatch.config import ConfigError
    from minibatch.workloads.mixed import chat_and_documents
    with pytest.raises(ConfigError, match=r"rush=\(250.0, 100.0\) is not allowed.*duration_s=300.0"):
        chat_and_documents(duration_s=300.0, rush=(250.0, 100.0))
    requests, classes = chat_and_documents(duration_s=60.0, rush=(10.0, 20.0), seed=3)
    assert len(requests) == len(classes) and set(classes) == {"chat", "document"}
    assert [w.arrival_s for w in requests] == sorted(w.arrival_s for w in requests)
    assert all(w.params.priority == (0 if k == "chat" else 1) for w, k in zip(requests, classes))
