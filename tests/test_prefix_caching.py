"""Prefix caching: the hash chain, sharing and eviction in the block manager, tokens equal to transformers'
with the cache on (every scheduler, two block sizes, preemption, chunking, speculation), the counts
it reports, and the block manager's invariants on random workloads with shared prefixes (hypothesis)."""
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.workloads import Poisson
from minibatch.config import ConfigError
from minibatch.engine.kv import BlockManager, block_hashes, hash_block
from minibatch.llm import make_engine
from minibatch.serving.monitoring import exposition
from tests.conftest import reference_greedy

SYSTEM = list(range(200, 237))                                       # 37 tokens shared by every prompt
PROMPTS = [SYSTEM + [5, 6, 7], SYSTEM + list(range(60, 75)), SYSTEM + [42], SYSTEM + [5, 6, 7, 8, 9, 10, 11],
           list(range(100, 150)), SYSTEM + [3] * 17]
NEW = 20


@pytest.fixture(scope="module")
def references(tiny_hf):
    model, _ = tiny_hf
    return [reference_greedy(model, p, NEW) for p in PROMPTS]


def test_hash_chain_names_the_whole_prefix():
    a, b = block_hashes([1, 2, 3, 4, 5, 6, 7], 3), block_hashes([9, 2, 3, 4, 5, 6], 3)
    assert len(a) == 2 and len(b) == 2                                   # the partial tail has no hash
    assert a[0] == hash_block(b"", [1, 2, 3]) and a[1] == hash_block(a[0], [4, 5, 6])
    assert a[1] != b[1], "same block tokens after a different prefix must hash differently"


def test_shared_blocks_are_counted_kept_and_evicted_least_recently_used():
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    tokens = [1, 2, 3, 4, 5]
    assert bm.cached_prefix(tokens) == []
    bm.allocate(0, 5)
    bm.cache_full_blocks(0, tokens, 5)                                   # blocks 0 and 1 are full: cached
    prefix = bm.cached_prefix(tokens)
    assert prefix == [0, 1]
    assert bm.cached_prefix([1, 2, 3, 4]) == [0], "the last token is always left to compute"
    bm.allocate(1, 5, prefix)
    assert bm.block_tables[1] == [0, 1, 3] and bm.ref_counts == {0: 2, 1: 2, 2: 1, 3: 1}
    assert bm.num_tokens_stored == 6                                    # 5 + 5, the two shared blocks once
    bm.free(0)
    bm.free(1)
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 2 and bm.num_free_blocks == 6
    bm.record_lookup(5, 4)
    bm.allocate(2, 12)                                                  # 6 blocks: the free ones, then both cached
    assert bm.block_tables[2][:4] == [4, 5, 2, 3] and sorted(bm.block_tables[2][4:]) == [0, 1]
    assert bm.cached_prefix(tokens) == [] and bm.prefix_cache.hits == 4


def test_eviction_takes_the_oldest_cached_block_and_shrink_keeps_hashed_blocks():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    for rid, tokens in enumerate(([1, 2, 3], [7, 8, 9])):
        bm.allocate(rid, 3)
        bm.cache_full_blocks(rid, tokens, 2)
        bm.free(rid)                                                     # request 0's block parks first
    assert list(bm.prefix_cache.evictable) == [0, 2]
    assert bm.allocate(5, 5) == [1, 3, 0]                                  # two free blocks, then the oldest cached
    assert bm.cached_prefix([1, 2, 3]) == [] and bm.cached_prefix([7, 8, 9]) == [2]
    bm.shrink(5, 3)
    assert len(bm.block_tables[5]) == 2


def test_config_refuses_what_prefix_caching_cannot_serve():
    refused = "enable_prefix_caching=True is not allowed: False with "
    with pytest.raises(ConfigError, match=refused + "kv_layout='contiguous'"):
        EngineConfig(model="tiny", kv_layout="contiguous", enable_prefix_caching=True)
    with pytest.raises(ConfigError, match=refused + "speculative_method='draft'"):
        EngineConfig(model="tiny", speculative_method="draft", speculative_model="tiny", enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="enable_prefix_caching=1 is not allowed: True or False"):
        EngineConfig(model="tiny", enable_prefix_caching=1)


def generate(config, prompts=PROMPTS, new=NEW):
    llm = LLM(config)
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=new), use_tqdm=False)
    blocks = llm.engine.blocks
    assert blocks.num_used_blocks == 0 and len(blocks.free_blocks) + blocks.num_cached_blocks == blocks.num_blocks
    return llm, outs


@pytest.mark.parametrize("scheduler", ["static", "continuous", "edge"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_greedy_matches_generate_with_the_cache_on(references, scheduler, block_size):
    llm, outs = generate(EngineConfig(model="tiny", scheduler=scheduler, max_batch_size=2, block_size=block_size,
                                      enable_prefix_caching=True))
    assert [o.token_ids for o in outs] == references
    assert sum(o.metrics.num_cached_tokens for o in outs) > 0, "the shared system prompt was never reused"
    assert outs[4].metrics.num_cached_tokens == 0                       # the one prompt without it
    assert [o.num_cached_tokens for o in outs] == [o.metrics.num_cached_tokens for o in outs]
    assert llm.engine.prefix_cache_hits == sum(o.metrics.num_cached_tokens for o in outs)


def test_preemption_with_the_cache_on(references):
    llm, outs = generate(EngineConfig(model="tiny", max_batch_size=6, block_size=4, num_kv_blocks=24,
                                      enable_prefix_caching=True))
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "the KV pool was meant to force preemption"
    assert [o.token_ids for o in outs] == references
    assert llm.engine.prefix_cache_queries > sum(len(p) for p in PROMPTS), "re-admissions look up again"


def test_chunked_prefill_with_the_cache_on(references):
    llm, outs = generate(EngineConfig(model="tiny", max_batch_size=3, max_tokens_per_step=7, block_size=4,
                                      enable_prefix_caching=True))
    assert [o.token_ids for o in outs] == references
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in llm.engine.step_records) <= 7


@pytest.mark.parametrize("method", ["ngram", "layer_skip"])
def test_speculative_rollback_with_the_cache_on(references, method):
    llm, outs = generate(EngineConfig(model="tiny", max_batch_size=2, block_size=4, speculative_method=method,
                                      num_speculative_tokens=3, enable_prefix_caching=True))
    assert [o.token_ids for o in outs] == references


def test_shared_system_prompt_saves_prefill_and_reports_it():
    """Requests arriving one after another: all but the first find the system prompt's blocks."""
    workload = [WorkloadRequest(0.05 * i, SYSTEM + [10 + i] * 3, SamplingParams(max_new_tokens=4, ignore_eos=True))
                for i in range(5)]
    reports = {}
    for on in (False, True):
        llm = LLM(EngineConfig(model="tiny", clock="simulated", block_size=8, enable_prefix_caching=on))
        reports[on] = llm.run(workload, use_tqdm=False)
    prefill = {on: sum(st.num_prefill_tokens for st in r.steps) for on, r in reports.items()}
    summary = reports[True].summary()
    assert [r.num_cached_tokens for r in reports[True].requests] == [0, 32, 32, 32, 32]
    assert prefill[False] - prefill[True] == summary["cached_tokens"] == summary["prefix_cache_hits"] == 128
    assert summary["prefix_cache_queries"] == 5 * 40 and reports[False].summary()["prefix_cache_queries"] == 0
    text = exposition(llm)
    assert "minibatch:prefix_cache_queries_total" in text and "minibatch:prefix_cache_hits_total" in text
    assert reports[True].steps[-1].cached_blocks, "the finished requests' blocks stay cached"


def test_blocks_filled_in_decode_are_cached():
    llm = LLM(EngineConfig(model="tiny", block_size=4, enable_prefix_caching=True))
    first = llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=10, ignore_eos=True), use_tqdm=False)[0]
    again = llm.generate([[1, 2, 3] + first.token_ids], SamplingParams(max_new_tokens=2), use_tqdm=False)[0]
    assert again.metrics.num_cached_tokens == 12                          # 3 + 9 computed tokens: three full blocks


class CheckingRunner:
    """Stands in for the model: checks the block manager's invariants before every step, then returns
    logits for token 3 (so identical prompts decode identical blocks, which get shared too)."""

    def __init__(self, engine):
        self.engine = engine

    def execute(self, plan):
        blocks = self.engine.blocks
        cache = blocks.prefix_cache
        holders = Counter(b for table in blocks.block_tables.values() for b in table)
        assert holders == blocks.ref_counts, "a reference count differs from the tables holding the block"
        used = len(holders)
        assert used + len(blocks.free_blocks) + blocks.num_cached_blocks == blocks.num_blocks
        assert not set(blocks.free_blocks) & set(cache.evictable), "a block both free and cached"
        assert all(holders[b] == 0 for b in cache.evictable) and all(holders[b] == 0 for b in blocks.free_blocks)
        for seq in plan.seqs:
            positions = torch.arange(seq.start, seq.start + seq.num_new_tokens).numpy()
            written = {int(s) // blocks.block_size for s in blocks.slots(seq.request.request_id, positions)}
            assert not any(holders[b] > 1 or b in cache.hash_of for b in written), "a shared or cached block is written"
        logits = torch.zeros(sum(s.samples for s in plan.seqs), self.engine.model.vocab_size)
        logits[:, 3] = 1.0
        return logits


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(1, 12)), min_size=1, max_size=12),
       scheduler=st.sampled_from(["static", "continuous", "edge"]), max_batch_size=st.integers(1, 4),
       budget=st.integers(4, 40), block_size=st.sampled_from([1, 2, 4]), spare_blocks=st.integers(0, 12))
def test_block_manager_invariants_with_shared_prefixes(requests, scheduler, max_batch_size, budget, block_size,
                                                      spare_blocks):
    """Prompts are one of three prefixes (lengths 0, 9, 20) plus a few own tokens; tight pools preempt."""
    prefixes = [[], list(range(50, 59)), list(range(70, 90))]
    prompts = [prefixes[k] + list(range(1, own + 1)) or [1] for k, own, _ in requests]
    worst = max(-(-(len(p) + n) // block_size) for p, (_, _, n) in zip(prompts, requests))
    engine = make_engine(EngineConfig(model="tiny", scheduler=scheduler, max_batch_size=max_batch_size,
                                      max_tokens_per_step=budget, block_size=block_size,
                                      num_kv_blocks=worst + spare_blocks, enable_prefix_caching=True))
    engine.runner = CheckingRunner(engine)
    added = [engine.add_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))
             for p, (_, _, n) in zip(prompts, requests)]
    for _ in range(5_000):
        if not engine.has_unfinished():
            break
        assert engine.step() is not None, "the engine stalled with work left"
    assert all(r.is_finished and r.output_token_ids == [3] * r.params.max_new_tokens for r in added)
    blocks = engine.blocks
    assert not blocks.block_tables and blocks.num_used_blocks == 0 and not blocks.ref_counts
    assert len(blocks.free_blocks) + blocks.num_cached_blocks == blocks.num_blocks, "every block is free or cached"
    summary_hits = sum(s.prefix_cache_hits for s in engine.step_records)
    assert summary_hits == engine.prefix_cache_hits <= engine.prefix_cache_queries


def test_kv_map_marks_shared_and_cached_blocks():
    import matplotlib
    matplotlib.use("Agg")
    from minibatch.viz import kv_block_map, shared_blocks
    from minibatch.viz.kv_map import CACHED, CACHED_COLOUR, block_owners

    workload = [WorkloadRequest(0.02 * i, SYSTEM + [10 + i] * 3, SamplingParams(max_new_tokens=6, ignore_eos=True))
                for i in range(4)]
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, block_size=8, num_kv_blocks=32,
                           enable_prefix_caching=True))
    report = llm.run(workload, use_tqdm=False)
    busiest = max(range(len(report.steps)), key=lambda i: len(shared_blocks(report.steps[i])))
    assert shared_blocks(report.steps[busiest]) == sorted(report.steps[busiest].block_tables[0].blocks[:4])
    title = kv_block_map(report, 8, step=busiest).axes[0].get_title()
    assert f"{len(shared_blocks(report.steps[busiest]))} shared" in title
    last = report.steps[-1]
    owner, _ = block_owners(last, 32, 8)
    assert last.cached_blocks and all(owner[b] == CACHED for b in last.cached_blocks)
    image = kv_block_map(report, 8, step=-1, columns=8).axes[0].images[0].get_array()
    b = min(last.cached_blocks)
    assert (image[b // 8, (b % 8) * 8] == CACHED_COLOUR).all()


def test_bench_compares_cache_on_and_off_and_skips_a_missing_vllm(monkeypatch):
    from minibatch.bench import prefix
    from minibatch.workloads.shared_prefix import shared_prompt_workload

    llms = {name: LLM(EngineConfig(model="tiny", clock="simulated", block_size=8, enable_prefix_caching=on))
            for name, on in (("off", False), ("on", True))}
    workload = shared_prompt_workload(llms["off"].tokenizer, 5, system_len=40, num_system_prompts=1,
                                      arrival=Poisson(1.0))
    assert len({tuple(w.prompt[:40]) for w in workload}) == 1
    off, on = prefix.compare_prefix_caching(llms, workload, reps=2)
    assert off["cached_tokens"] == 0 and on["cached_tokens"] > 0
    assert off["prefill_tokens"] - on["prefill_tokens"] == on["cached_tokens"]
    assert on["hit_rate"] > 0 and on["mean_ttft_s"] < off["mean_ttft_s"]      # the simulated clock: same every run
    monkeypatch.setenv("MINIBATCH_VLLM", "/no/vllm/here")                   # over HTTP: vLLM's rows are skipped
    rows = prefix.http_rows(EngineConfig(model="tiny", block_size=8), workload)
    assert [r["engine"] for r in rows] == ["minibatch cache off", "minibatch cache on"]
    assert not any(r["failed"] for r in rows)


def test_prefix_cache_panel_compares_off_and_on_and_follows_its_sliders():
    from minibatch.widgets import PrefixCachePanel

    panel = PrefixCachePanel(model="tiny", system_len=128, num_system_prompts=1, num_kv_blocks=256)
    off, on = panel.numbers["off"], panel.numbers["on"]
    assert off["cached_tokens"] == 0 < on["cached_tokens"] and on["prefill_tokens"] < off["prefill_tokens"]
    assert off["prefill_tokens"] - on["prefill_tokens"] == on["cached_tokens"]
    assert panel.image.value[:4] == b"\x89PNG" and "shared" in panel.figure().axes[0].get_title()
    one_prompt = on["hit_rate"]
    panel.prompts.value = 16
    assert panel.numbers["on"]["hit_rate"] < one_prompt
