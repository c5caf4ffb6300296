"""KV memory accounting: bytes per token, what a budget holds under each layout, the per-step block
tables the engine records, and a run's memory report, on hand-made records and on runs of `tiny`."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.config import ConfigError
from minibatch.engine.kv import BlockManager, blocks_for
from minibatch.analysis.memory import LLAMA2_7B, KVShape, KVSpec, capacity, memory_report
from minibatch.engine.records import BlockTableRecorder, KVHolding
from minibatch.analysis.metrics import RunReport
from minibatch.engine.records import StepRecord


def test_bytes_per_token_follows_the_formula():
    smol = KVShape.of_model("smollm2-135m")
    assert (smol.num_layers, smol.num_kv_heads, smol.head_dim) == (30, 3, 64)
    for shape in (smol, KVShape("smol bf16", 30, 3, 64, "bfloat16"), LLAMA2_7B):
        size = torch.empty((), dtype=getattr(torch, shape.dtype)).element_size()
        assert shape.bytes_per_token == 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * size
    assert LLAMA2_7B.bytes_per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024


def test_capacity_by_hand():
    paged = capacity(1024, 1 << 20, block_size=16, tokens_per_seq=40)
    assert paged == {"tokens": 1024, "blocks": 64, "block_tokens": 1024, "blocks_per_seq": 3, "max_seqs": 21}
    contiguous = capacity(1024, 1 << 20, block_size=16, tokens_per_seq=40, layout="contiguous", max_model_len=256)
    assert (contiguous["blocks_per_seq"], contiguous["max_seqs"]) == (16, 4)
    longer = capacity(1024, 1 << 20, block_size=16, tokens_per_seq=300, layout="contiguous", max_model_len=256)
    assert longer["max_seqs"] == 64 // 19
    assert "max_seqs" not in capacity(1024, 1 << 20)


@settings(max_examples=40, deadline=None)
@given(bytes_per_token=st.integers(1, 4096), blocks=st.integers(0, 200), extra=st.integers(0, 4095),
       block_size=st.sampled_from([1, 4, 16]), tokens=st.integers(1, 300), layout=st.sampled_from(["paged", "contiguous"]),
       max_model_len=st.integers(2, 300))
def test_capacity_matches_what_the_block_manager_admits(bytes_per_token, blocks, extra, block_size, tokens, layout,
                                                        max_model_len):
    budget = blocks * bytes_per_token * block_size + min(extra, bytes_per_token * block_size - 1)  # a partial block is no block
    if budget < 1:
        return
    cap = capacity(bytes_per_token, budget, block_size, tokens, layout, max_model_len)
    manager = BlockManager(cap["blocks"], block_size, layout, max_model_len)
    admitted = 0
    while manager.can_allocate(admitted, tokens):
        manager.allocate(admitted, tokens)
        admitted += 1
    assert cap["blocks"] == blocks and cap["max_seqs"] == admitted


@pytest.mark.parametrize("kwargs, message", [
    ({"bytes_per_token": 0}, "bytes_per_token=0 is not allowed: an integer >= 1"),
    ({"budget_bytes": 1.5}, "budget_bytes=1.5 is not allowed"),
    ({"layout": "ring"}, "layout='ring' is not allowed: choose one of 'paged', 'contiguous'"),
    ({"layout": "contiguous"}, "max_model_len=None is not allowed with layout='contiguous'"),
])
def test_capacity_rejects_bad_input(kwargs, message):
    args = {"bytes_per_token": 1024, "budget_bytes": 1 << 20, **kwargs}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        capacity(**args)


def test_shape_rejects_bad_fields():
    with pytest.raises(ConfigError, match="KVShape.head_dim=0 is not allowed"):
        KVShape("x", 2, 2, 0)
    with pytest.raises(ConfigError, match="KVShape.dtype='int8' is not allowed"):
        KVShape("x", 2, 2, 8, "int8")


def test_recorder_shares_unchanged_tables():
    manager, recorder = BlockManager(10, 4), BlockTableRecorder()
    manager.allocate(0, 3)
    manager.allocate(1, 5)
    first = recorder.snapshot(manager)
    assert first == {0: KVHolding(3, (0,)), 1: KVHolding(5, (1, 2))}
    manager.allocate(0, 4)                                   # same block, one more token
    second = recorder.snapshot(manager)
    assert second[1] is first[1] and second[0] == KVHolding(4, (0,))
    manager.allocate(0, 5)                                   # crosses a boundary: a new block
    manager.free(1)
    third = recorder.snapshot(manager)
    assert third == {0: KVHolding(5, (0, 3))}


def step(index, holdings, num_blocks, block_size, batch_size=None, preempted=0):
    used = sum(len(h.blocks) for h in holdings.values())
    return StepRecord(step=index, start=float(index), end=index + 1.0, batch_size=batch_size or len(holdings),
                      num_prefill_tokens=0, num_decode_tokens=len(holdings), queue_depth=0, kv_blocks_used=used,
                      kv_blocks_total=num_blocks, idle_slots=0, num_preempted=preempted,
                      kv_tokens_stored=sum(h.tokens for h in holdings.values()), block_tables=holdings)


def test_memory_report_by_hand():
    steps = [step(0, {0: KVHolding(5, (0, 1)), 1: KVHolding(3, (2,))}, 8, 4),      # 8 tokens in 12 slots
             step(1, {0: KVHolding(6, (0, 1)), 1: KVHolding(4, (2,)), 2: KVHolding(1, (3,))}, 8, 4, preempted=1)]
    report = RunReport(requests=[], steps=steps, max_batch_size=4)
    spec = KVSpec(bytes_per_token=100, block_size=4, num_blocks=8, layout="paged", max_model_len=64)
    memory = memory_report(report, spec)
    assert memory["budget_bytes"] == 8 * 4 * 100
    assert memory["peak_reserved_bytes"] == 16 * 100 and memory["peak_used_bytes"] == 11 * 100
    assert memory["mean_reserved_bytes"] == pytest.approx(14 * 100) and memory["mean_used_bytes"] == pytest.approx(9.5 * 100)
    assert memory["waste_fraction"] == pytest.approx(1 - 19 / 28)
    assert (memory["max_concurrent_seqs"], memory["max_batch_size_seen"], memory["preemptions"]) == (3, 3, 1)
    with pytest.raises(ConfigError, match="report has no steps"):
        memory_report(RunReport([], [], 4), spec)


def workload(n, prompt_len, max_new_tokens):
    return [WorkloadRequest(0.0, [3 + i % 50] * prompt_len, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
            for i in range(n)]


def simulated(layout, num_kv_blocks, n=10, prompt_len=37, max_new_tokens=20, max_model_len=128, block_size=16):
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=16, kv_layout=layout,
                           num_kv_blocks=num_kv_blocks, max_model_len=max_model_len, block_size=block_size))
    return llm, llm.run(workload(n, prompt_len, max_new_tokens), use_tqdm=False)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_recorded_tables_agree_with_the_step_counters(layout):
    llm, report = simulated(layout, num_kv_blocks=40)
    reserve = blocks_for(llm.engine.max_model_len, 16)
    for record in report.steps:
        blocks = [b for held in record.block_tables.values() for b in held.blocks]
        assert len(blocks) == len(set(blocks)) == record.kv_blocks_used          # no block has two owners
        assert all(0 <= b < record.kv_blocks_total for b in blocks)
        assert sum(h.tokens for h in record.block_tables.values()) == record.kv_tokens_stored
        for held in record.block_tables.values():
            expected = max(blocks_for(held.tokens, 16), reserve) if layout == "contiguous" else blocks_for(held.tokens, 16)
            assert len(held.blocks) == expected                                  # paged: only the tail block is partial


def test_paged_fits_more_and_wastes_less_than_contiguous():
    budget_blocks = 40
    memory = {}
    for layout in ("paged", "contiguous"):
        llm, report = simulated(layout, budget_blocks)
        memory[layout] = memory_report(report, llm)
        assert memory[layout]["budget_bytes"] == budget_blocks * 16 * llm.engine.kv_cache.bytes_per_token
    per_seq = capacity(memory["paged"]["bytes_per_token"], memory["paged"]["budget_bytes"], 16, 37 + 20)
    contiguous = capacity(memory["paged"]["bytes_per_token"], memory["paged"]["budget_bytes"], 16, 37 + 20,
                          "contiguous", 128)
    assert memory["contiguous"]["max_concurrent_seqs"] == contiguous["max_seqs"] == 5
    assert memory["paged"]["max_concurrent_seqs"] == 10 <= per_seq["max_seqs"]          # all ten fit at once
    assert memory["paged"]["waste_fraction"] < 15 / (37 + 15)                           # at most a partial block each
    assert memory["contiguous"]["waste_fraction"] > 1 - (37 + 20) / 128
    assert memory["paged"]["preemptions"] == memory["contiguous"]["preemptions"] == 0


def test_a_tight_budget_preempts_and_the_report_counts_it():
    llm, report = simulated("paged", num_kv_blocks=12, n=6, prompt_len=30, max_new_tokens=40)
    memory = report.memory(llm)
    assert memory["preemptions"] == report.summary()["preemptions"] > 0
    assert memory["peak_reserved_bytes"] <= memory["budget_bytes"]


def test_real_run_records_tables():
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, num_kv_blocks=32, block_size=8))
    report = llm.run(workload(5, 11, 6), use_tqdm=False)
    memory = report.memory(llm)
    assert memory["max_concurrent_seqs"] == 4 and memory["layout"] == "paged"
    first = report.steps[0].block_tables
    assert sorted(first) == [0, 1, 2, 3] and all(h.tokens == 11 and len(h.blocks) == 2 for h in first.values())
    assert not llm.engine.blocks.block_tables                                    # everything freed at the end
