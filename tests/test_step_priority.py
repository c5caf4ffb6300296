"""Decode-first against prefill-first (`EngineConfig.step_priority`), and the open lab built on them.

Counts, model stubbed: while a long prompt is prefilled beside three decoding requests, decode-first
gives every decoder its token in every step and the prompt what is left of the budget; prefill-first
gives the prompt the whole budget and the decoders nothing until it is in. Invariants (hypothesis):
under prefill-first a step decodes only when its prompt tokens leave budget, nobody is preempted to
admit a newcomer, every request finishes once and every block comes back. Correct: greedy tokens
equal transformers' generate() under both orders, with chunking and preemption. (The open lab built
on them, chapter 05's exercise 2, is checked in tests/test_checkers.py.)
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.config import ConfigError
from minibatch.llm import make_engine
from tests.conftest import reference_greedy
from tests.test_engine_correctness import NEW, PROMPTS
from tests.test_scheduler_properties import StubRunner

BUDGET, LONG = 8, 40      # a step's token budget; the long prompt's tokens (five budgets' worth)


def burst_steps(step_priority: str):
    """Three requests decoding when a 40-token prompt arrives: the records of the steps from its arrival
    to its first token, the three decoders' ids and the long request's id."""
    engine = make_engine(EngineConfig(model="tiny", max_batch_size=4, max_tokens_per_step=BUDGET, block_size=4,
                                      num_kv_blocks=64, step_priority=step_priority))
    engine.runner = StubRunner(engine)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    decoders = [engine.add_request([1, 2], params).request_id for _ in range(3)]
    engine.step()                                           # the three short prompts, together
    engine.step()                                           # a decode step of three
    long = engine.add_request(list(range(1, LONG + 1)), params)
    first = len(engine.step_records)
    while not long.output_token_ids:
        engine.step()
    return engine.step_records[first:], set(decoders), long.request_id


def computing(record) -> set[int]:
    return {rid for rid, kind in record.slots.values() if kind != "held"}


def test_decode_first_gives_the_decoders_their_tokens_and_the_prompt_the_rest():
    steps, decoders, long = burst_steps("decode-first")
    assert len(steps) == LONG // (BUDGET - 3)                # chunks of 5 = 8 - 3 decode tokens
    for record in steps:
        assert (record.num_prefill_tokens, record.num_decode_tokens) == (BUDGET - 3, 3)
        assert computing(record) == decoders | {long}


def test_prefill_first_gives_the_prompt_the_budget_and_stalls_the_decoders():
    steps, decoders, long = burst_steps("prefill-first")
    assert len(steps) == LONG // BUDGET                      # chunks of the whole budget
    for record in steps:
        assert (record.num_prefill_tokens, record.num_decode_tokens) == (BUDGET, 0)
        assert computing(record) == {long}


def test_prefill_first_decodes_in_the_budget_the_prompts_leave():
    engine = make_engine(EngineConfig(model="tiny", max_batch_size=4, max_tokens_per_step=BUDGET, block_size=4,
                                      num_kv_blocks=64, step_priority="prefill-first"))
    engine.runner = StubRunner(engine)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    decoders = {engine.add_request([1, 2], params).request_id for _ in range(2)}
    engine.step()
    short = engine.add_request([1, 2, 3], params)           # 3 prompt tokens leave 5 of the budget
    engine.step()
    record = engine.step_records[-1]
    assert (record.num_prefill_tokens, record.num_decode_tokens) == (3, 2)
    assert computing(record) == decoders | {short.request_id}


@pytest.fixture(scope="module")
def references(tiny_hf):
    model, _ = tiny_hf
    return [reference_greedy(model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("step_priority", ["decode-first", "prefill-first"])
@pytest.mark.parametrize("max_batch_size,num_kv_blocks,budget", [(3, 256, 64), (6, 32, 16), (4, 40, 5)])
def test_greedy_matches_generate_under_both_orders(references, step_priority, max_batch_size, num_kv_blocks, budget):
    llm = LLM(EngineConfig(model="tiny", step_priority=step_priority, max_batch_size=max_batch_size, block_size=4,
                           num_kv_blocks=num_kv_blocks, max_tokens_per_step=budget))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references
    assert llm.engine.blocks.num_free_blocks == num_kv_blocks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 20), st.integers(0, 6)), min_size=1, max_size=10),
       max_batch_size=st.integers(1, 5), budget=st.integers(1, 48), spare_blocks=st.integers(0, 20))
def test_prefill_first_invariants(requests, max_batch_size, budget, spare_blocks):
    block_size = 4
    worst = max(-(-(p + n) // block_size) for p, n, _ in requests)
    engine = make_engine(EngineConfig(model="tiny", max_batch_size=max_batch_size, max_tokens_per_step=budget,
                                      block_size=block_size, num_kv_blocks=worst + spare_blocks, max_model_len=96,
                                      step_priority="prefill-first"))
    engine.runner = StubRunner(engine)
    pending = sorted(requests, key=lambda r: r[2])           # (prompt, new tokens, the step at which it arrives)
    added, finished = [], []
    for step in range(10_000):
        while pending and pending[0][2] <= step:
            p, n, _ = pending.pop(0)
            added.append(engine.add_request(list(range(1, p + 1)), SamplingParams(max_new_tokens=n, ignore_eos=True)))
        if not pending and not engine.has_unfinished():
            break
        admitted = {r.request_id for r in engine.scheduler.waiting}
        done = engine.step()
        if done is None:
            assert pending, "the engine stalled with work left"
            continue
        finished.extend(done)
        record = engine.step_records[-1]
        assert record.num_prefill_tokens + record.num_decode_tokens <= budget
        if record.num_decode_tokens:
            assert record.num_prefill_tokens < budget, "a decode took budget that prompt work wanted"
        newcomers = admitted & computing(record)
        assert not (record.num_preempted and newcomers), "a running request was preempted to admit a newcomer"
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in added)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks and not engine.blocks.block_tables


def test_step_priority_is_checked():
    with pytest.raises(ConfigError, match=r"step_priority='decode_first' is not allowed.*'decode-first', 'prefill"):
        EngineConfig(model="tiny", step_priority="decode_first")
    with pytest.raises(ConfigError, match=r"step_priority='prefill-first'.*scheduler='static'"):
        EngineConfig(model="tiny", scheduler="static", step_priority="prefill-first")
