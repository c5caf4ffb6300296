"""The `LLM` facade, shaped like vLLM's: `generate()` for a batch of prompts, `run()` for a workload.

`make_engine(config)` builds the engine an `EngineConfig` asks for: on real parts, or on the
simulator's (`clock="simulated"`). The facade sits above the wings it joins: the engine, the
simulator, the workloads it serves and the run report it returns.

`generate` hands every prompt to the engine at once and steps until all are done. `run` serves a
workload whose requests arrive over time: each is added when the clock reaches its arrival, and
an engine with nothing to do sleeps until the next arrival or batching deadline. With
`arrival=ClosedLoop(users, think_s)` the requests go out in order instead, each user sending the next
once answered (and a think time later).
"""
from __future__ import annotations

from dataclasses import dataclass

from tqdm.auto import tqdm

from minibatch.config import ConfigError, EngineConfig, SamplingParams
from minibatch.analysis.metrics import RunReport
from minibatch.engine.arrivals import TimedArrivals
from minibatch.engine.llm_engine import LLMEngine
from minibatch.engine.parts import ModelParts
from minibatch.engine.plugins import Plugins
from minibatch.engine.records import RequestMetrics
from minibatch.engine.request import Request
from minibatch.engine.tokens import is_chat
from minibatch.sim.parts import simulated_parts
from minibatch.workloads import ClosedLoop, WorkloadRequest


def make_engine(config: EngineConfig, clock=None, plugins: Plugins | None = None) -> LLMEngine:
    """The engine a config asks for: the real model and clock, or the simulator's parts; `plugins`
    replaces pieces of it with yours (`minibatch.engine.plugins`)."""
    parts = simulated_parts(config) if config.clock == "simulated" else ModelParts()
    return LLMEngine(config, parts, clock=clock, plugins=plugins)


@dataclass
class CompletionOutput:
    """One continuation of a prompt (vLLM's name): the i-th of SamplingParams.n."""

    index: int
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[int, float]] | None   # per token: the chosen and top-N log-probabilities (params.logprobs)


@dataclass
class RequestOutput:
    """A prompt's result; token_ids, text and finish_reason are those of its first continuation, outputs[0]."""

    request_id: int
    prompt: str | list | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: RequestMetrics
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0     # prompt tokens served from the prefix cache (vLLM's name)
    # per prompt token (params.prompt_logprobs, vLLM's shape): None for the first, then {token id: log-probability}
    # holding the prompt's own token and the top-N at its position; once per prompt, whatever n
    prompt_logprobs: list[dict[int, float] | None] | None = None


class LLM:
    """An engine with a friendly front: `LLM(EngineConfig(...))`, `LLM(model="tiny", ...)` or, as vLLM's,
    `LLM("tiny", ...)`; with `plugins=Plugins(scheduler=..., allocator=..., attention=...)` it runs your
    pieces, checked."""

    def __init__(self, config: EngineConfig | str | None = None, clock=None, plugins: Plugins | None = None,
                 **config_fields):
        if isinstance(config, str):                      # the model's name first, as vLLM's LLM takes it
            if "model" in config_fields:
                raise ConfigError(f"model given twice: {config!r} and model={config_fields['model']!r}; pass one")
            config, config_fields = None, {"model": config, **config_fields}
        if config is not None and not isinstance(config, EngineConfig):
            raise ConfigError(f"config={config!r} is not allowed: pass an EngineConfig, a model name "
                              "or the config's fields as keywords")
        if config is not None and config_fields:
            raise ConfigError("pass either an EngineConfig or its fields as keywords, not both")
        self.config = config or EngineConfig(**config_fields)
        self.engine = make_engine(self.config, clock=clock, plugins=plugins)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (enable_prefix_caching), so the next run starts cold (vLLM's name)."""
        self.engine.blocks.reset_prefix_cache()

    def _encode_all(self, prompts, sampling_params, field="prompts"):
        if isinstance(prompts, str) or is_chat(prompts) or (
                isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ConfigError(f"{field}={prompts!r} is not allowed: pass at least one prompt")
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ConfigError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts: "
                              "give one, or one per prompt")
        ids = [self.engine.prompts.encode(p, field=f"{field}[{i}]") for i, p in enumerate(prompts)]
        for i, p in zip(ids, params):
            self.engine.check_request(i, p.for_sample(0))
        return prompts, ids, params

    def _output(self, samples: list[Request], prompt) -> RequestOutput:
        outputs = [CompletionOutput(i, list(r.output_token_ids), self.engine.prompts.decode(r.output_token_ids),
                                    r.finish_reason, list(r.output_logprobs) if r.params.logprobs is not None else None)
                   for i, r in enumerate(samples)]
        first = samples[0]
        return RequestOutput(first.request_id, prompt, first.prompt_token_ids, outputs[0].token_ids, outputs[0].text,
                             outputs[0].finish_reason, RequestMetrics.of(first), outputs, first.num_cached_tokens,
                             first.prompt_logprobs)

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Serve every prompt, all arriving now; outputs come back in prompt order, each with its n continuations."""
        prompts, ids, params = self._encode_all(prompts, sampling_params)
        samples = [[self.engine.add_request(i, p.for_sample(k)) for k in range(p.n)] for i, p in zip(ids, params)]
        with tqdm(total=sum(map(len, samples)), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                self.engine.follow_free_cores()
                finished = self.engine.step()
                bar.update(len(finished or ()))
        return [self._output(s, p) for s, p in zip(samples, prompts)]

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Like generate, for one chat (a list of messages) or a list of chats, using the chat template."""
        chats = [messages] if is_chat(messages) else messages
        return self.generate(list(chats), sampling_params, use_tqdm)

    def run(self, workload: list[WorkloadRequest], use_tqdm: bool = True, arrival: ClosedLoop | None = None
            ) -> RunReport:
        """Serve requests arriving over time (arrival_s after the start) and report what happened; with
        `arrival=ClosedLoop(...)`, served in order by that many users instead (their arrival_s ignored)."""
        if not workload or not all(isinstance(w, WorkloadRequest) for w in workload):
            raise ConfigError("workload is not allowed: pass a non-empty list of WorkloadRequest")
        if arrival is not None and not isinstance(arrival, ClosedLoop):
            raise ConfigError(f"arrival={arrival!r} is not allowed: None (each request at its arrival_s) or "
                              "ClosedLoop(users, think_s); draw arrival times with make_workload(..., arrival=...)")
        _, ids, params = self._encode_all([w.prompt for w in workload], [w.params for w in workload], field="workload")
        several = next((p.n for p in params if p.n != 1), None)
        if several:
            raise ConfigError(f"SamplingParams.n={several} is not allowed in a workload: each request is one "
                              "continuation (n=1); give each its own WorkloadRequest")
        engine = self.engine
        first_step, start = len(engine.step_records), engine.clock.now()
        with tqdm(total=len(workload), desc=f"run ({self.config.scheduler})", unit="req", disable=not use_tqdm) as bar:
            items = [(w.arrival_s, prompt_ids, p) for w, prompt_ids, p in zip(workload, ids, params)]
            on_step = lambda finished: bar.update(len(finished))
            arrivals = (TimedArrivals(items, start, on_step) if arrival is None
                        else arrival.arrivals(items, start, on_step))
            engine.serve(arrivals)
        requests = arrivals.requests
        metrics = [RequestMetrics.of(requests[i]) for i in range(len(workload))]
        return RunReport(metrics, engine.step_records[first_step:], self.config.batch_slots, start_time=start)
