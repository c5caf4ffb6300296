"""The engine's step loop: schedule, run, sample, update, record.

`LLMEngine` owns the pieces (model, KV cache, block manager, scheduler, decoder, clock) and moves
every request forward one step at a time. Requests are checked when they are added, so bad input
fails before any work starts and never disturbs the requests already being served. `serve` is the
arrival loop around the steps; the few counts a server or a dashboard reads are public methods.
"""
from __future__ import annotations

import torch

from minibatch.config import ConfigError, EngineConfig, SamplingParams
from minibatch.engine.cuda_graphs import with_cuda_graphs
from minibatch.engine.kernels import get_backend
from minibatch.engine.kv import KVCache, blocks_for, kv_bytes_per_token, pool_blocks
from minibatch.engine.parts import ModelParts
from minibatch.engine.ops import make_ops
from minibatch.engine.plugins import Plugins
from minibatch.engine.records import BlockTableRecorder, PhaseTimer, StepRecord
from minibatch.engine.request import Request
from minibatch.engine.resolve import resolve
from minibatch.engine.runner import keep_prompt_logprobs
from minibatch.engine.schedulers import StepPlan
from minibatch.engine.speculative import make_decoder
from minibatch.engine.threads import ThreadFollower, use_threads
from minibatch.engine.timing import StepProfiler
from minibatch.engine.tokens import PromptEncoder

DEFAULT_MAX_MODEL_LEN = 4096   # cap on the model's own context, so the default KV budget holds several sequences


class LLMEngine:
    """Holds the model and the cache, accepts requests, and advances them one step at a time."""

    def __init__(self, config: EngineConfig, parts: ModelParts, clock=None, plugins: Plugins | None = None):
        """`parts` makes the model, runner, sampler and clock (`minibatch.llm.make_engine` picks them);
        `clock`, if given, replaces the parts' clock; `plugins` replaces pieces with yours (`engine.plugins`)."""
        self.config = config
        plugins = plugins or Plugins()
        plugins.check_config(config)
        step_of = lambda: len(self.step_records)                       # the step being built, for messages
        self.resolved = resolve(config)                                # every "auto" decided, once
        self.device, self.dtype = self.resolved.device, self.resolved.dtype
        on_cpu = self.device.type == "cpu" or config.cpu_threads is not None
        self.cpu_threads = use_threads(config.cpu_threads) if on_cpu else torch.get_num_threads()  # free cores
        self.threads = ThreadFollower(self.cpu_threads) if on_cpu and config.cpu_threads is None else None
        self.kernels, self.attention_backend = self.resolved.kernels, self.resolved.attention_backend
        self.backend = plugins.attention_backend(get_backend(self.attention_backend), step_of)
        self.ops = make_ops(self.kernels, self.backend)              # the path's operations (engine/ops)
        loaded = parts.load(config.model)
        context = loaded.config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > context:
            raise ConfigError(f"EngineConfig.max_model_len={config.max_model_len} is not allowed: "
                              f"the model's context is {context} tokens")
        self.max_model_len = config.max_model_len or min(context, DEFAULT_MAX_MODEL_LEN)
        self.model = parts.model(loaded, self.ops, self.dtype, self.device, self.max_model_len, config.quantization)
        self.prompts = PromptEncoder(loaded.tokenizer, self.model.vocab_size, self.max_model_len)
        self.eos_token_ids = set(loaded.eos_token_ids)
        per_token = kv_bytes_per_token(self.model.num_layers, self.model.num_kv_heads, self.model.head_dim, self.dtype)
        num_blocks = pool_blocks(config.num_kv_blocks, config.kv_cache_memory_bytes, config.block_size, per_token,
                                 self.max_model_len, config.batch_slots)
        self.kv_cache = KVCache(self.model.num_layers, num_blocks, config.block_size, self.model.num_kv_heads,
                                self.model.head_dim, self.dtype, parts.kv_device(self.device))
        self.blocks = plugins.block_manager(step_of, num_blocks, config.block_size, config.kv_layout,
                                            self.max_model_len, config.enable_prefix_caching)
        self.block_recorder = BlockTableRecorder()                   # each step's block tables, for the KV-block map
        self.scheduler = plugins.make_scheduler(config, self.blocks, step_of)
        self.runner = parts.runner(self.model, self.kv_cache, self.blocks, self.device)
        self.clock = clock or parts.clock(config, loaded.config)
        if config.cuda_graphs:
            self.runner = with_cuda_graphs(self.runner, config.batch_slots, self.max_model_len)
        sampler = plugins.wrap_sampler(parts.sampler(config.seed, self.eos_token_ids), step_of)
        self.decoder = make_decoder(config, sampler, self.model, self.kv_cache, self.blocks, self.device,
                                    self.dtype, self.max_model_len)  # plain or speculative
        self.profiler = StepProfiler(self.device) if config.profile_steps else None
        if self.profiler:
            self.profiler.instrument(self.model, self.runner)
        self.requests: dict[int, Request] = {}
        self.step_records: list[StepRecord] = []
        self.step_observers: list = []   # callables f(record, finished) run after every step (monitoring, dashboards)
        if self.decoder.drafts:
            self.step_observers.append(self.decoder.observe_step)   # speculation learns what its steps cost
        self._next_id = 0

    @property
    def tokenizer(self):
        return self.prompts.tokenizer

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise ConfigError if this request can never be served by this engine."""
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"sampling_params={params!r} is not allowed: pass a SamplingParams")
        self._check_sampling(params)
        worst = min(len(prompt_ids) + params.max_new_tokens, self.max_model_len)
        need = max(blocks_for(worst, self.blocks.block_size), self.blocks.reserve_blocks)
        if need > self.blocks.num_blocks:
            raise ConfigError(
                f"request needs {need} KV blocks (prompt {len(prompt_ids)} + max_new_tokens {params.max_new_tokens} "
                f"tokens) but EngineConfig.num_kv_blocks={self.blocks.num_blocks}: it can never fit; "
                "raise num_kv_blocks / kv_cache_memory_bytes or lower max_new_tokens")

    def _check_sampling(self, params: SamplingParams) -> None:
        """The sampling fields this engine serves only in some configurations."""
        if params.n != 1:
            raise ConfigError(f"SamplingParams.n={params.n} is not allowed for one engine request: add the n "
                              "continuations as requests of their own (SamplingParams.for_sample(i)); "
                              "LLM.generate and the server do")
        if params.priority != 0 and self.config.scheduling_policy != "priority":
            raise ConfigError(f"SamplingParams.priority={params.priority} is not allowed with EngineConfig."
                              f"scheduling_policy={self.config.scheduling_policy!r}: leave it at 0, or set "
                              "scheduling_policy='priority'")
        if any(t >= self.model.vocab_size for t in params.logit_bias or {}):
            raise ConfigError(f"SamplingParams.logit_bias={params.logit_bias!r} is not allowed: token ids are in "
                              f"[0, {self.model.vocab_size})")
        if params.prompt_logprobs is not None and self.config.sim_skip_model:
            raise ConfigError(f"SamplingParams.prompt_logprobs={params.prompt_logprobs} is not allowed with "
                              "EngineConfig.sim_skip_model=True: no model runs to score the prompt; leave it at None")
        if self.decoder.drafts:
            for name, neutral in (("logprobs", None), ("prompt_logprobs", None), ("min_tokens", 0),
                                  ("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                                  ("logit_bias", None)):
                if getattr(params, name) not in (neutral, {}):
                    raise ConfigError(f"SamplingParams.{name}={getattr(params, name)!r} is not allowed with "
                                      "speculative decoding (EngineConfig.speculative_method="
                                      f"{self.config.speculative_method!r}): leave it at {neutral!r}")

    def add_request(self, prompt_ids: list[int], params: SamplingParams, arrival_time: float | None = None) -> Request:
        """Queue an already encoded and checked prompt; returns its Request."""
        arrival = self.clock.now() if arrival_time is None else arrival_time
        request = Request(self._next_id, list(prompt_ids), params, arrival)
        self._next_id += 1
        self.requests[request.request_id] = request
        self.scheduler.add(request)
        return request

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_waiting(self) -> int:
        """Requests in the queue, not yet running."""
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        """Requests holding a slot that have not finished."""
        return sum(1 for r in self.scheduler.running if not r.is_finished)

    @property
    def kv_usage(self) -> float:
        """The share of KV blocks in use, 0 to 1 (vLLM's kv_cache_usage_perc)."""
        return self.blocks.num_used_blocks / self.blocks.num_blocks

    @property
    def prefix_cache_queries(self) -> int:
        """Tokens looked up in the prefix cache at admission, over the engine's life (vLLM's name; 0 when off)."""
        return self.blocks.prefix_cache.queries if self.blocks.prefix_cache else 0

    @property
    def prefix_cache_hits(self) -> int:
        """Of those, tokens found cached and not computed again (vLLM's name)."""
        return self.blocks.prefix_cache.hits if self.blocks.prefix_cache else 0

    def next_wake_time(self, *others: float | None) -> float | None:
        """The earliest of the scheduler's batching deadline and `others` (None where there is none)."""
        return min((t for t in (self.scheduler.wake_time(), *others) if t is not None), default=None)

    def serve(self, arrivals) -> None:
        """Serve requests as they arrive (an `engine.arrivals.Arrivals`) until none remain."""
        while arrivals.admit(self) or self.has_unfinished():
            self.follow_free_cores()
            finished = self.step()
            if finished is None:                                         # nothing can run yet: wait
                arrivals.wait_until(self, self.next_wake_time(arrivals.next_event()))
            else:
                arrivals.after_step(finished)

    def follow_free_cores(self) -> None:
        """Between steps: take the cores other programs leave free now (`threads.ThreadFollower`, on the CPU
        when `cpu_threads` is not fixed; it looks at most once a second)."""
        if self.threads:
            self.cpu_threads = self.threads.follow()

    def abort(self, request: Request, reason: str = "abort") -> None:
        """End a request between steps ("abort": a client went away; "stop": a stop string); its blocks go back."""
        if not request.is_finished:
            self.scheduler.abort(request)
            self._finish(request, reason, self.clock.now())

    def release(self, request: Request) -> None:
        """Forget a finished request (a server's requests come and go)."""
        self.requests.pop(request.request_id, None)

    def forget_old_steps(self, keep: int) -> None:
        """Bound the step records (a server runs for days): at 2 x keep records, keep the latest keep."""
        if len(self.step_records) > 2 * keep:
            del self.step_records[:-keep]

    def step(self) -> list[Request] | None:
        """One step; returns the requests that finished in it, or None if nothing could run."""
        timer, start = PhaseTimer(self.profiler), self.clock.now()
        with timer("schedule"):
            queries, hits = self.prefix_cache_queries, self.prefix_cache_hits
            plan = self.scheduler.schedule(start)
            if not plan.seqs:
                return None
            record = self._describe(plan, start)
            record.prefix_cache_queries = self.prefix_cache_queries - queries
            record.prefix_cache_hits = self.prefix_cache_hits - hits
        with timer("propose", counted=self.decoder.drafts):
            self.decoder.propose(plan)                                   # draft tokens, when speculating
        with timer("model"):
            logits = self.runner.execute(plan)                           # (S, V), plus a row per draft token
        with timer("sample"):
            logits = keep_prompt_logprobs(plan, logits)                  # prompt_logprobs rows: scored, split off
            outputs, logprobs, record.spec_outcomes = self.decoder.choose(logits, plan)  # 1 to k + 1 tokens each
        with timer("update"):
            record.end = self.clock.charge_step(plan, start)
            finished = self._update(plan, outputs, logprobs, start, record.end)
        record.phase_times = timer.times()
        self.step_records.append(record)
        for observe in self.step_observers:
            observe(record, finished)
        return finished

    def _describe(self, plan: StepPlan, start: float) -> StepRecord:
        slots = {self.scheduler.slot_of[s.request.request_id]:
                 (s.request.request_id, "prefill" if s.is_prefill else "decode") for s in plan.seqs}
        slots.update({slot: (rid, "held") for slot, rid in plan.held_slots.items()})
        return StepRecord(
            step=len(self.step_records), start=start, end=start, batch_size=len(plan.seqs),
            num_prefill_tokens=sum(s.num_new_tokens for s in plan.seqs if s.is_prefill),
            num_decode_tokens=sum(1 for s in plan.seqs if not s.is_prefill),
            queue_depth=len(self.scheduler.waiting), kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_total=self.blocks.num_blocks, kv_tokens_stored=self.blocks.num_tokens_stored,
            idle_slots=self.scheduler.max_batch_size - len(plan.seqs),
            num_preempted=len(plan.preempted), slots=slots, block_tables=self.block_recorder.snapshot(self.blocks),
            cached_blocks=self.block_recorder.cached(self.blocks))

    def _update(self, plan: StepPlan, outputs: list[list[int]], logprobs: list, start: float,
                now: float) -> list[Request]:
        sampling = [s.request for s in plan.seqs if s.samples]             # read before the tokens are counted
        for seq in plan.seqs:
            seq.request.num_computed_tokens += seq.num_new_tokens
            if seq.request.first_scheduled_time is None:
                seq.request.first_scheduled_time = start
        finished = []
        for request, tokens, token_logprobs in zip(sampling, outputs, logprobs):
            request.num_computed_tokens += len(tokens) - 1                   # accepted draft tokens are cached too
            if token_logprobs is not None:
                request.output_logprobs.append(token_logprobs)
            for token in tokens:
                request.output_token_ids.append(token)
                request.token_times.append(now)
                if request.first_token_time is None:
                    request.first_token_time = now
                reason = self._stop_reason(request, token)
                if reason:
                    self._finish(request, reason, now)
                    finished.append(request)
                    break
        self.decoder.rewind(plan)                                        # release the rejected drafts' slots
        for seq in plan.seqs:                                            # blocks that filled are cached (if on)
            if not seq.request.is_finished:
                self._cache_full_blocks(seq.request)
        return finished

    def _cache_full_blocks(self, request: Request) -> None:
        self.blocks.cache_full_blocks(request.request_id, request.all_token_ids, request.num_computed_tokens)

    def _stop_reason(self, request: Request, token: int) -> str | None:
        p = request.params
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(request.output_token_ids) >= p.max_new_tokens or request.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(self, request: Request, reason: str, now: float) -> None:
        request.finish(reason, now)
        self._cache_full_blocks(request)                                 # before its blocks are let go
        self.scheduler.finish(request)
        self.decoder.release(request.request_id)
