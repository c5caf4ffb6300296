"""Extension points: five pieces of the engine you can replace with your own, checked while they run.

Each is a small protocol the engine already uses for its own pieces, so yours runs exactly where
the engine's would, on the real model:

- `scheduler`: a subclass of `engine.schedulers.Scheduler` (or a factory `(config, block_manager)`
  returning one) whose `schedule(now)` returns a `StepPlan`: who computes how many tokens this step.
  Its `finish(request)` frees what a finished request held (`leave` gives its slot back).
- `allocator`: a subclass of `engine.kv.BlockManager` (or a factory taking BlockManager's arguments)
  whose `allocate(request_id, num_tokens)` grows a request's block table from `free_blocks` and
  whose `free(request_id)` gives every block back.
- `attention`: `attend(query, k_cache, v_cache, block_table, context_len, scale)`, the paged
  attention of ONE sequence: its `query` rows (Tq, Hq, D) sit at positions `context_len - Tq ..
  context_len - 1` and each sees the cached positions up to its own, found through `block_table`
  in the caches (num_blocks, block_size, Hkv, D); returns (Tq, Hq, D). The engine loops over a
  step's sequences and writes the new K/V itself.
- `sampling_rule`: `rule(logits, requests)`: the next token of each of the step's S sampling rows,
  from logits (S, V) after logit bias, min_tokens and penalties; `requests[i].params` is row i's
  `SamplingParams`.
- `prefix_hash`: `hash_fn(parent_hash, token_ids)`, the name of a full KV block under prefix
  caching, chained over its parent's (the first block's parent is `b""`).

Pass them to `LLM(config, plugins=Plugins(...))` (or `make_engine` / `LLMEngine`). With
`check_invariants=True` (the default) each piece runs inside a guard (`engine.guards`) that checks
the rules the rest of the engine relies on and stops at the first one broken with an
`InvariantError` naming the piece, the step, the request and the rule. The engine's own pieces run
unguarded: the tests check them once and for all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minibatch.config import ConfigError, EngineConfig
from minibatch.engine import guards
from minibatch.engine.kv import BlockManager
from minibatch.engine.schedulers import Scheduler, make_scheduler

InvariantError = guards.InvariantError


@dataclass
class Plugins:
    """Your pieces for the engine; None keeps the engine's own."""

    scheduler: Callable | None = None      # Scheduler subclass, or (config, block_manager) -> Scheduler
    allocator: Callable | None = None      # BlockManager subclass, or a factory with BlockManager's arguments
    attention: Callable | None = None      # attend(query, k_cache, v_cache, block_table, context_len, scale)
    sampling_rule: Callable | None = None  # rule(logits (S, V), requests) -> S token ids
    prefix_hash: Callable | None = None    # hash_fn(parent_hash, token_ids) -> a hashable name of the block
    check_invariants: bool = True          # guard each piece with the engine's invariants

    def __post_init__(self):
        for name in ("scheduler", "allocator", "attention", "sampling_rule", "prefix_hash"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(f"Plugins.{name}={value!r} is not allowed: pass a class or a function (or None "
                                  "for the engine's own)")
        if not isinstance(self.check_invariants, bool):
            raise ConfigError(f"Plugins.check_invariants={self.check_invariants!r} is not allowed: True or False")

    def check_config(self, config: EngineConfig) -> None:
        """Refuse the combinations a piece cannot serve, before anything is built."""
        if self.prefix_hash is not None and not config.enable_prefix_caching:
            raise ConfigError("Plugins.prefix_hash is not allowed with EngineConfig.enable_prefix_caching=False: "
                              "nothing would call it; set enable_prefix_caching=True")
        if config.cuda_graphs and self.attention is not None:
            raise ConfigError("Plugins.attention is not allowed with EngineConfig.cuda_graphs=True: a Python "
                              "loop over sequences cannot be captured; set cuda_graphs=False")
        if config.sim_skip_model and (self.attention is not None or self.sampling_rule is not None):
            raise ConfigError("Plugins.attention and Plugins.sampling_rule are not allowed with EngineConfig."
                              "sim_skip_model=True: the model is skipped, so nothing would call them")
        if config.speculative_method and self.sampling_rule is not None:
            raise ConfigError(f"Plugins.sampling_rule is not allowed with EngineConfig.speculative_method="
                              f"{config.speculative_method!r}: verification samples with the engine's own rule; "
                              "use speculative_method=None")

    def block_manager(self, step_of: Callable[[], int], *args, **kwargs) -> BlockManager:
        """The allocator (yours, guarded, or the engine's) built with BlockManager's arguments."""
        if self.prefix_hash is not None:
            hash_fn = guards.checked_hash(self.prefix_hash, step_of) if self.check_invariants else self.prefix_hash
            kwargs["hash_fn"] = hash_fn
        if self.allocator is None:
            return BlockManager(*args, **kwargs)
        allocator = self.allocator(*args, **kwargs)
        if not isinstance(allocator, BlockManager):
            raise ConfigError(f"Plugins.allocator made {allocator!r}, which is not allowed: subclass "
                              "minibatch.engine.kv.BlockManager and override allocate and free")
        return guards.guard_allocator(allocator, step_of) if self.check_invariants else allocator

    def make_scheduler(self, config: EngineConfig, blocks, step_of: Callable[[], int]) -> Scheduler:
        """The scheduler (yours, guarded, or the one `config.scheduler` names)."""
        if self.scheduler is None:
            return make_scheduler(config, blocks)
        scheduler = self.scheduler(config, blocks)
        if not isinstance(scheduler, Scheduler):
            raise ConfigError(f"Plugins.scheduler made {scheduler!r}, which is not allowed: subclass "
                              "minibatch.engine.schedulers.Scheduler and write its schedule(now)")
        return guards.guard_scheduler(scheduler, step_of) if self.check_invariants else scheduler

    def attention_backend(self, backend, step_of: Callable[[], int]):
        """The attention backend: the one `attention_backend` names, or your per-sequence loop over it."""
        if self.attention is None:
            return backend
        return guards.SequenceAttention(self.attention, step_of, self.check_invariants)

    def wrap_sampler(self, sampler, step_of: Callable[[], int]):
        """The sampler, or one whose tokens your sampling rule chooses."""
        if self.sampling_rule is None:
            return sampler
        return guards.RuleSampler(sampler, self.sampling_rule, step_of, self.check_invariants)
