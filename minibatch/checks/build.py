"""The build track (chapters 03, 06, 07, capstone): your scheduler, allocator and prefix hash inside the engine.

Each checker plugs the learner's piece into a real engine (`LLM(config, plugins=Plugins(...))`) on
the `tiny` model, with the engine's guards on (`minibatch.engine.guards`): a broken rule stops the run
with the guard's message, which names the step, the request and the rule. It then compares what the
piece did, step by step, with the engine's own piece on the same requests, and every request's
tokens with transformers' greedy `generate()` for that prompt alone.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from minibatch.checks.core import checker

NEW_TOKENS = (12, 3, 20, 7, 1, 15, 9, 4, 18, 6)            # output lengths, cycled over the prompts


def _prompts(count: int, longest: int, seed: int) -> list[list[int]]:
    """Token-id prompts of 1 to `longest` tokens (tiny's vocabulary), the same for every run."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, 200, int(rng.integers(1, longest + 1))).tolist() for _ in range(count)]


# (EngineConfig fields, number of prompts, longest prompt): each stresses one rule
SCHEDULER_RUNS = [
    ({"max_batch_size": 4, "max_tokens_per_step": 512}, 10, 30),     # joins and leaves at every step
    ({"max_batch_size": 3, "max_tokens_per_step": 16}, 6, 60),       # long prompts: chunks within the budget
    ({"max_batch_size": 8, "max_tokens_per_step": 24}, 8, 20),       # the budget, not the slots, limits joins
]
ALLOCATOR_RUNS = [
    ({"max_batch_size": 4, "block_size": 4, "num_kv_blocks": 64}, 8, 30),   # plenty of blocks
    ({"max_batch_size": 6, "block_size": 4, "num_kv_blocks": 16}, 8, 20),   # too few: preemption frees blocks
    ({"max_batch_size": 3, "block_size": 1, "num_kv_blocks": 60}, 5, 12),   # one token per block
]


@functools.lru_cache(maxsize=1)
def _tiny_reference():
    from minibatch.engine.models import load_hf

    return load_hf("tiny")[0]


def reference_tokens(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """transformers' greedy tokens on `tiny` for each prompt alone."""
    from minibatch.bench.check import reference_outputs

    return reference_outputs(_tiny_reference(), prompts, lengths, use_tqdm=False)


def serve(fields: dict, prompts: list[list[int]], plugins=None):
    """Serve prompts on `tiny` with these EngineConfig fields and plugins; (outputs, per-step plans, engine).
    A plan is the (request id, tokens computed) of each scheduled sequence, in order."""
    from minibatch import LLM, EngineConfig, SamplingParams

    llm = LLM(EngineConfig(model="tiny", device="cpu", **fields), plugins=plugins)   # float32: exact tokens
    plans, schedule = [], llm.engine.scheduler.schedule

    def recorded(now):
        plan = schedule(now)
        plans.append([(s.request.request_id, s.num_new_tokens) for s in plan.seqs])
        return plan

    llm.engine.scheduler.schedule = recorded
    params = [SamplingParams(max_new_tokens=NEW_TOKENS[i % len(NEW_TOKENS)], ignore_eos=True)
              for i in range(len(prompts))]
    outputs = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    return outputs, plans, llm.engine


def _engine_error(piece: str, run):
    """Run `run()`; an InvariantError or a crash inside the engine becomes the checker's AssertionError."""
    from minibatch.engine.plugins import InvariantError

    try:
        return run()
    except NotImplementedError:                    # the stub: the checker reports "not solved yet"
        raise
    except InvariantError as err:
        raise AssertionError(f"the engine stopped your {piece}:\n{err}") from None
    except (RuntimeError, KeyError, IndexError, ValueError, AttributeError, TypeError) as err:
        raise AssertionError(f"your {piece} crashed inside the engine: {type(err).__name__}: {err}") from None


def _check_tokens(outputs, prompts, fields, piece):
    lengths = [NEW_TOKENS[i % len(NEW_TOKENS)] for i in range(len(prompts))]
    for i, (got, want) in enumerate(zip(outputs, reference_tokens(prompts, lengths))):
        assert got == want, (f"with your {piece} and EngineConfig({fields}), request {i}'s tokens differ from "
                             f"transformers' generate():\n  expected: {want}\n  got:      {got}")


def _first_difference(mine: list, theirs: list) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                None if len(mine) == len(theirs) else min(len(mine), len(theirs)))


@checker("your Scheduler subclass, serving requests inside the engine")
def check_scheduler(scheduler_class):
    """Runs the learner's scheduler beside the engine's ContinuousScheduler: same plans, same tokens."""
    from minibatch import Plugins

    for seed, (fields, count, longest) in enumerate(SCHEDULER_RUNS):
        prompts = _prompts(count, longest, seed)
        _, theirs, _ = serve(fields, prompts)
        plugins = Plugins(scheduler=scheduler_class)
        outputs, mine, _ = _engine_error("scheduler", lambda: serve(fields, prompts, plugins))
        step = _first_difference(mine, theirs)
        if step is not None:
            got = mine[step] if step < len(mine) else "nothing"
            want = theirs[step] if step < len(theirs) else "nothing"
            raise AssertionError(
                f"with EngineConfig({fields}) and {count} requests arriving at once, step {step} differs from the "
                f"engine's continuous scheduler ((request id, tokens) of each sequence):\n  expected: {want}\n"
                f"  got:      {got}\n  (serve the running first, in order, then admit from the head of the queue)")
        _check_tokens(outputs, prompts, fields, "scheduler")
    return len(SCHEDULER_RUNS)


def _grow_and_free(allocator_class, block_size: int, order: list[int], steps: list[tuple[int, int]]):
    """Drive an allocator by hand: (request id, tokens) grows a table, (request id, 0) frees it; the state
    after each call."""
    from collections import deque

    from minibatch.engine.guards import guard_allocator

    blocks = guard_allocator(allocator_class(len(order), block_size), lambda: 0)
    blocks.free_blocks = deque(order)
    states = []
    for request_id, num_tokens in steps:
        if num_tokens:
            blocks.allocate(request_id, num_tokens)
        else:
            blocks.free(request_id)
        states.append(({r: list(t) for r, t in blocks.block_tables.items()}, list(blocks.free_blocks)))
    return states


ALLOCATOR_SCRIPTS = [  # block size, free list order, [(request, tokens to hold) or (request, 0): free]
    (4, list(range(8)), [(0, 1), (0, 4), (0, 5), (1, 9), (0, 0), (1, 12), (2, 13)]),
    (4, [5, 2, 7, 0, 1, 3, 6, 4], [(0, 7), (1, 2), (0, 8), (1, 5), (1, 0), (0, 16), (2, 3), (0, 0)]),
    (16, [3, 1, 2, 0], [(0, 15), (1, 17), (0, 16), (0, 17), (1, 0), (2, 1)]),
]


@checker("your BlockManager subclass (allocate and free), serving requests inside the engine")
def check_allocator(allocator_class):
    """By hand beside the engine's BlockManager (same tables and free lists), then inside the engine."""
    from minibatch import Plugins
    from minibatch.engine.kv import BlockManager

    for block_size, order, steps in ALLOCATOR_SCRIPTS:
        mine = _engine_error("allocator", lambda: _grow_and_free(allocator_class, block_size, order, steps))
        theirs = _grow_and_free(BlockManager, block_size, order, steps)
        for (request_id, tokens), (got_tables, got_free), (want_tables, want_free) in zip(steps, mine, theirs):
            call = f"allocate({request_id}, {tokens})" if tokens else f"free({request_id})"
            assert (got_tables, got_free) == (want_tables, want_free), (
                f"after {call} (block_size {block_size}, free list at the start {order}):\n"
                f"  expected: block_tables {want_tables}, free_blocks {want_free}\n"
                f"  got:      block_tables {got_tables}, free_blocks {got_free}\n"
                "  (take new blocks from the front of free_blocks, give freed ones back at its end, in table order)")
    for seed, (fields, count, longest) in enumerate(ALLOCATOR_RUNS):
        prompts = _prompts(count, longest, 10 + seed)
        plugins = Plugins(allocator=allocator_class)
        outputs, _, engine = _engine_error("allocator", lambda: serve(fields, prompts, plugins))
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, (
            f"with EngineConfig({fields}), {engine.blocks.num_blocks - engine.blocks.num_free_blocks} blocks were not "
            "back in the free list after every request ended")
        _check_tokens(outputs, prompts, fields, "allocator")
    return len(ALLOCATOR_SCRIPTS) + len(ALLOCATOR_RUNS)


@checker("your scheduler, allocator and attention, serving a workload together")
def check_built_engine(scheduler_class, allocator_class, attend):
    """All three pieces in one engine, on runs that chunk prompts and fill the batch; tokens against transformers."""
    from minibatch import Plugins

    plugins = Plugins(scheduler=scheduler_class, allocator=allocator_class, attention=attend)
    runs = [({**fields, "num_kv_blocks": 512}, count, longest) for fields, count, longest in SCHEDULER_RUNS]
    for seed, (fields, count, longest) in enumerate(runs):
        prompts = _prompts(count, longest, 20 + seed)
        outputs, _, engine = _engine_error("pieces", lambda: serve(fields, prompts, plugins))
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "KV blocks were left held after the run"
        _check_tokens(outputs, prompts, fields, "scheduler, allocator and attention")
    return len(runs)


@dataclass
class SideBySide:
    """One workload served twice, with the engine's pieces and with yours, and transformers' tokens."""

    reports: dict[str, object]            # "engine" and "yours": the RunReport of each run
    outputs: dict[str, list[list[int]]]   # the same keys: each request's tokens, in workload order
    reference: list[list[int]]            # transformers' greedy tokens for each prompt alone

    def matches(self) -> dict[str, bool]:
        """For each run: whether every request's tokens equal the reference."""
        return {name: out == self.reference for name, out in self.outputs.items()}

    def describe(self) -> str:
        from minibatch.bench.check import compare

        return "; ".join(f"{name}: {compare(out, self.reference).describe()}" for name, out in self.outputs.items())


def side_by_side(workload, plugins, model: str = "smollm2-135m", use_tqdm: bool = True, **fields) -> SideBySide:
    """Serve `workload` with EngineConfig(model, **fields), the engine's pieces then `plugins`, and compute
    transformers' greedy tokens for its prompts (the workload's requests set `ignore_eos`). The engine runs
    on the CPU in float32 unless `fields` say otherwise, so that the tokens compare exactly."""
    fields = {"device": "cpu", **fields}
    import gc

    from minibatch import LLM, EngineConfig
    from minibatch.bench.check import reference_outputs
    from minibatch.engine.models import load_hf

    reports, outputs = {}, {}
    for name, pieces in (("engine", None), ("yours", plugins)):
        llm = LLM(EngineConfig(model=model, **fields), plugins=pieces)
        reports[name] = llm.run(workload, use_tqdm=use_tqdm)
        requests = [llm.engine.requests[m.request_id] for m in reports[name].requests]
        outputs[name] = [r.output_token_ids for r in requests]
        prompts = [r.prompt_token_ids for r in requests]
        del llm
        gc.collect()
    reference = reference_outputs(load_hf(model)[0], prompts, [w.params.max_new_tokens for w in workload], use_tqdm)
    return SideBySide(reports, outputs, reference)


def _shared_prefix_prompts(seed: int, count: int, system_len: int, block_size: int) -> list[list[int]]:
    """Prompts that share one of two system prefixes (or none), then a question of their own."""
    import numpy as np

    rng = np.random.default_rng(seed)
    systems = [rng.integers(3, 200, system_len).tolist() for _ in range(2)]
    prompts = []
    for i in range(count):
        head = systems[i % 3] if i % 3 < 2 else []
        prompts.append(head + rng.integers(3, 200, int(rng.integers(1, 2 * block_size))).tolist())
    return prompts


HASH_RUNS = [  # EngineConfig fields, number of prompts, system prefix length
    ({"max_batch_size": 1, "block_size": 4, "enable_prefix_caching": True}, 7, 18),     # one at a time: reuse
    ({"max_batch_size": 4, "block_size": 8, "enable_prefix_caching": True, "num_kv_blocks": 24}, 9, 33),  # eviction
]


@checker("your prefix hash hash_fn(parent_hash, token_ids), naming the engine's cached blocks")
def check_prefix_hash(hash_fn):
    """The engine serves shared-prefix prompts with the learner's hash: same cache hits as with its own, same tokens."""
    from minibatch import Plugins

    for seed, (fields, count, system_len) in enumerate(HASH_RUNS):
        prompts = _shared_prefix_prompts(seed, count, system_len, fields["block_size"])
        _, _, theirs = serve(fields, prompts)
        outputs, _, mine = _engine_error("prefix hash", lambda: serve(fields, prompts, Plugins(prefix_hash=hash_fn)))
        found = [[r.num_cached_tokens for r in engine.requests.values()] for engine in (mine, theirs)]
        assert found[0] == found[1], (
            f"with EngineConfig({fields}) and prompts sharing a {system_len}-token prefix, the prompt tokens found in "
            f"the cache differ from those the engine's own hash finds:\n  expected: {found[1]}\n"
            f"  got:      {found[0]}\n"
            "  (two blocks must get the same name exactly when their tokens and every token before them are equal)")
        _check_tokens(outputs, prompts, fields, "prefix hash")
    return len(HASH_RUNS)
