"""Extension points: a learner's correct piece runs inside the engine with the reference's tokens, and a
planted broken piece is stopped by the engine's guard with a message naming the step, request and rule."""
import itertools

import pytest

from conftest import reference_greedy
from learner_pieces import ForgetsRefCounts, FreeListAllocator, JoinLeaveScheduler, LosesFreedBlocks, attend, greedy
from minibatch import LLM, ConfigError, EngineConfig, Plugins, SamplingParams
from minibatch.engine.kv import hash_block
from minibatch.engine.plugins import InvariantError
from minibatch.engine.schedulers import ContinuousScheduler, StaticScheduler, StepPlan

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7], list(range(20, 50)), [9] * 20, [5, 6, 7, 8, 9, 10, 11, 12, 14]]
PARAMS = SamplingParams(max_new_tokens=10, ignore_eos=True)


def serve(plugins, **fields):
    config = EngineConfig(**{"model": "tiny", "max_batch_size": 3, "max_tokens_per_step": 16, "block_size": 4,
                             "num_kv_blocks": 64, **fields})
    llm = LLM(config, plugins=plugins)
    outputs = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    return outputs, llm.engine


@pytest.fixture(scope="module")
def reference(tiny_hf):
    return [reference_greedy(tiny_hf[0], p, PARAMS.max_new_tokens) for p in PROMPTS]


@pytest.mark.parametrize("plugins, fields", [
    (Plugins(scheduler=JoinLeaveScheduler), {}),
    (Plugins(scheduler=ContinuousScheduler), {"num_kv_blocks": 14}),          # the engine's own, preempting
    (Plugins(scheduler=ContinuousScheduler), {"step_priority": "prefill-first", "num_kv_blocks": 14}),
    (Plugins(scheduler=StaticScheduler), {}),
    (Plugins(allocator=FreeListAllocator), {"num_kv_blocks": 14}),
    (Plugins(attention=attend), {}),
    (Plugins(sampling_rule=greedy), {}),
    (Plugins(prefix_hash=hash_block), {"enable_prefix_caching": True}),
    (Plugins(scheduler=JoinLeaveScheduler, allocator=FreeListAllocator, attention=attend), {}),
], ids=["scheduler", "engine-continuous", "engine-prefill-first", "engine-static", "allocator", "attention",
        "sampling", "prefix-hash", "all"])
def test_correct_pieces_serve_the_reference_tokens(plugins, fields, reference):
    outputs, engine = serve(plugins, **fields)
    assert outputs == reference
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks        # every block back after the run


# ---- planted mistakes, one rule each --------------------------------------------------------------

class NoSlotLimit(JoinLeaveScheduler):
    def schedule(self, now):
        self.max_batch_size = 99                                          # forgets the slot limit
        plan = super().schedule(now)
        self.max_batch_size = 3
        return plan


class WholePrompts(JoinLeaveScheduler):
    def tokens_to_compute(self, request, budget):
        return request.num_tokens - request.num_computed_tokens          # ignores the budget


class Twice(JoinLeaveScheduler):
    def schedule(self, now):
        plan = super().schedule(now)
        plan.seqs += plan.seqs[-1:]
        return plan


class FirstOnly(JoinLeaveScheduler):
    def schedule(self, now):
        plan = super().schedule(now)
        plan.seqs = plan.seqs[:1]                                         # the others never progress
        return plan


class NeverAdmits(JoinLeaveScheduler):
    def schedule(self, now):
        return StepPlan()


class NoAllocation(JoinLeaveScheduler):
    def schedule(self, now):
        self.blocks.allocate = lambda *args: None
        return super().schedule(now)


class KeepsSlots(JoinLeaveScheduler):
    def finish(self, request):
        Scheduler_finish(self, request)                                   # frees blocks, never leaves


def Scheduler_finish(scheduler, request):
    scheduler.blocks.free(request.request_id)


class NeverFrees(JoinLeaveScheduler):
    def finish(self, request):
        self.leave(request)


class PeeksFreeList(FreeListAllocator):
    def allocate(self, request_id, num_tokens, prefix=()):
        table = self.block_tables.setdefault(request_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free_blocks[0])                              # never takes it out
            self.ref_counts[table[-1]] = self.ref_counts.get(table[-1], 0) + 1
        self.tokens_stored[request_id] = num_tokens
        return table


def last_row_only(query, k_cache, v_cache, block_table, context_len, scale):
    return attend(query, k_cache, v_cache, block_table, context_len, scale)[-1]


def no_max_subtracted(query, k_cache, v_cache, block_table, context_len, scale):
    return attend(query, k_cache, v_cache, block_table, context_len, scale) * float("nan")


def vocab_size_token(logits, requests):
    return [logits.shape[-1]] * len(requests)


counter = itertools.count()


def counting_hash(parent, tokens):
    return next(counter)


def tokens_only_hash(parent, tokens):
    return hash_block(b"", tokens)


def first_token_hash(parent, tokens):
    return hash_block(parent, tokens[:1])


@pytest.mark.parametrize("plugins, fields, message", [
    (Plugins(scheduler=NoSlotLimit), {"max_tokens_per_step": 512},
     r"admit, step 0: request 3 joins while all 3 slots are taken \(running: \[0, 1, 2\]\)"),
    (Plugins(scheduler=WholePrompts), {}, r"more than max_tokens_per_step=16"),
    (Plugins(scheduler=Twice), {}, r"step 0: request \d is scheduled twice in one step"),
    (Plugins(scheduler=FirstOnly), {}, r"step 0: request 1 is running but computes nothing"),
    (Plugins(scheduler=NeverAdmits), {}, r"step 0: requests \[0, 1, 2, 3\] wait, the batch is ready and nothing runs"),
    (Plugins(scheduler=NoAllocation), {}, r"step 0: request 0 computes up to token 9 but its KV blocks hold 0"),
    (Plugins(scheduler=KeepsSlots), {}, r"step \d+: request 0 finished \(length\) but was scheduled again"),
    (Plugins(scheduler=NeverFrees), {}, r"NeverFrees.finish, step \d+: request \d finished but still holds KV blocks"),
    (Plugins(allocator=PeeksFreeList), {}, r"allocate\(request 0, 9 tokens\), step 0: block 0 is held by request 0 "
                                           r"and is also in free_blocks"),
    (Plugins(allocator=LosesFreedBlocks), {}, r"free\(request \d\), step \d+: blocks \[.*\] are neither free nor held"),
    (Plugins(allocator=ForgetsRefCounts), {}, r"ref_counts\[\d+\] is None"),
    (Plugins(attention=last_row_only), {}, r"attention last_row_only, step 0: for request 0 in layer 0 \(9 query rows"),
    (Plugins(attention=no_max_subtracted), {}, r"returned inf or nan"),
    (Plugins(sampling_rule=vocab_size_token), {},
     r"(?s)row 0 \(request 0\) got 259.*an integer token id in \[0, 259\)"),
    (Plugins(prefix_hash=counting_hash), {"enable_prefix_caching": True}, r"got 0, then 1"),
    (Plugins(prefix_hash=tokens_only_hash), {"enable_prefix_caching": True}, r"after a different prefix"),
    (Plugins(prefix_hash=first_token_hash), {"enable_prefix_caching": True}, r"\(token 3 differs\) got the same name"),
], ids=["batch-size", "budget", "twice", "starves", "never-admits", "no-blocks", "keeps-slots", "never-frees",
        "block-twice", "loses-blocks", "ref-counts", "attention-shape", "attention-nan", "sampling-range",
        "hash-random", "hash-no-parent", "hash-first-token"])
def test_planted_mistake_is_named(plugins, fields, message):
    with pytest.raises(InvariantError, match=message):
        serve(plugins, **fields)


def test_guards_can_be_switched_off(reference):
    outputs, engine = serve(Plugins(scheduler=JoinLeaveScheduler, allocator=FreeListAllocator, check_invariants=False))
    assert outputs == reference
    assert "schedule" not in vars(engine.scheduler) and "allocate" not in vars(engine.blocks)   # no guard wrapped them


@pytest.mark.parametrize("plugins, fields, message", [
    (Plugins(prefix_hash=hash_block), {}, "enable_prefix_caching=False"),
    (Plugins(attention=attend), {"clock": "simulated", "sim_skip_model": True}, "the model is skipped"),
    (Plugins(sampling_rule=greedy), {"speculative_method": "ngram"}, "verification samples with the engine's own rule"),
    (Plugins(scheduler=lambda config, blocks: object()), {}, "subclass minibatch.engine.schedulers.Scheduler"),
    (Plugins(allocator=lambda *args, **kwargs: object()), {}, "subclass minibatch.engine.kv.BlockManager"),
])
def test_bad_plugins_are_refused_before_work(plugins, fields, message):
    with pytest.raises(ConfigError, match=message):
        serve(plugins, **fields)


def test_plugin_must_be_callable():
    with pytest.raises(ConfigError, match=r"Plugins.scheduler='continuous' is not allowed"):
        Plugins(scheduler="continuous")


def test_scheduler_serves_arrivals_like_the_engines_own():
    """Requests arriving over time, on the simulated clock: the learner's scheduler gives every request the same
    moments as the engine's ContinuousScheduler (with batch_timeout_s=0, the engine's rule is the learner's)."""
    from minibatch.workloads import Fixed, Poisson, make_workload

    config = EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=2,
                          max_tokens_per_step=32)
    workload = make_workload(12, arrival=Poisson(4.0), output_len=Fixed(6), seed=1)
    reports = [LLM(config, plugins=plugins).run(workload, use_tqdm=False)
               for plugins in (None, Plugins(scheduler=JoinLeaveScheduler))]
    moments = [[(r.ttft, r.e2e, r.num_output_tokens) for r in report.requests] for report in reports]
    assert moments[0] == moments[1] and all(n == 6 for _, _, n in moments[1])
