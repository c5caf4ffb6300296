"""Invariants of every scheduler, on random workloads (hypothesis), with the model replaced by a stub.

The stub returns fixed logits so the tests exercise scheduling and KV bookkeeping alone, fast:
a step never exceeds max_batch_size, the token budget or the KV pool; no block is owned twice;
every request finishes exactly once; after the run every block is back in the free pool.
"""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch import EngineConfig, SamplingParams
from minibatch.llm import make_engine
from minibatch.engine.kv import blocks_for


class StubRunner:
    """Stands in for the model: checks the plan against the pool, then returns logits for token 3."""

    def __init__(self, engine):
        self.engine = engine
        self.steps = 0

    def execute(self, plan):
        blocks = self.engine.blocks
        owned = [b for table in blocks.block_tables.values() for b in table]
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert set(owned).isdisjoint(blocks.free_blocks), "a block is both owned and free"
        assert len(owned) + blocks.num_free_blocks == blocks.num_blocks
        for seq in plan.seqs:
            needed = blocks_for(seq.start + seq.num_new_tokens, blocks.block_size)
            assert len(blocks.block_tables[seq.request.request_id]) >= needed, "tokens without a block"
        self.steps += 1
        logits = torch.zeros(sum(s.samples for s in plan.seqs), self.engine.model.vocab_size)
        logits[:, 3] = 1.0
        return logits


requests_strategy = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=requests_strategy,
    scheduler=st.sampled_from(["static", "continuous", "edge"]),
    max_batch_size=st.integers(1, 6),
    budget=st.integers(1, 64),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 40),
    layout=st.sampled_from(["paged", "contiguous"]),
)
def test_scheduler_invariants(requests, scheduler, max_batch_size, budget, block_size, spare_blocks, layout):
    max_model_len = 96
    worst = max(blocks_for(p + n, block_size) for p, n in requests)
    if layout == "contiguous":
        worst = blocks_for(max_model_len, block_size)
    config = EngineConfig(model="tiny", scheduler=scheduler, max_batch_size=max_batch_size, max_tokens_per_step=budget,
                          block_size=block_size, num_kv_blocks=worst + spare_blocks, kv_layout=layout,
                          max_model_len=max_model_len)
    engine = make_engine(config)
    engine.runner = StubRunner(engine)
    added = [engine.add_request(list(range(1, p + 1)), SamplingParams(max_new_tokens=n, ignore_eos=True))
             for p, n in requests]
    finished = []
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        done = engine.step()
        assert done is not None, "the engine stalled with work left"
        finished.extend(done)
        record = engine.step_records[-1]
        effective_batch = 1 if scheduler == "edge" else max_batch_size
        assert record.batch_size <= effective_batch
        assert record.num_prefill_tokens + record.num_decode_tokens <= budget
        assert record.kv_blocks_used <= config.num_kv_blocks
    assert sorted(r.request_id for r in finished) == [r.request_id for r in added], "each finishes exactly once"
    for request, (p, n) in zip(added, requests):
        assert request.is_finished and request.finish_reason == "length"
        assert request.output_token_ids == [3] * n
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks and not engine.blocks.block_tables
