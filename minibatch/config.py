"""Configuration of the engine and of each request, checked the moment it is built.

Two dataclasses, named after their vLLM counterparts so what is learned here transfers:
`EngineConfig` says how the server batches (scheduler, batch size, timeout, token budget) and how it
stores the KV cache (block size, number of blocks, layout); `SamplingParams` says how one request
picks its tokens. Every field is validated in `__post_init__`, so a bad value fails with a message
naming the field, the value and what is allowed, before any work starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from minibatch.validate import ConfigError as ConfigError  # re-exported: every module imports it from here
from minibatch.validate import check_choice, check_int, check_number, fail

SCHEDULERS = ("static", "continuous", "edge")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_LAYOUTS = ("paged", "contiguous")
ATTENTION_BACKENDS = ("auto", "torch", "numba", "numba-cuda")
KERNELS = ("auto", "reference", "fast")
CLOCKS = ("real", "simulated")
SPECULATIVE_METHODS = (None, "ngram", "draft", "layer_skip")
SCHEDULING_POLICIES = ("fcfs", "priority", "shortest_prompt")
QUANTIZATIONS = (None, "q8_0", "q4_1")
STEP_PRIORITIES = ("decode-first", "prefill-first")


def knob(default, help: str):
    """An EngineConfig field and its help text: every field is also a `python -m minibatch serve` flag."""
    return field(default=default, metadata={"help": help})


@dataclass
class EngineConfig:
    """How the engine loads the model, batches requests and stores the KV cache."""

    model: str = knob("smollm2-135m", "registry name ('smollm2-135m', 'tiny', ...), a local folder or a hub id")
    device: str = knob("auto", "'auto' picks CUDA when torch sees a GPU, else the CPU")
    dtype: str = knob("auto", "'auto': float32 on CPU, bfloat16 on CUDA")
    cpu_threads: int | None = knob(None, "CPU threads for products and kernels; None: the cores other programs leave "
                                         "free when the engine starts, at most OMP_NUM_THREADS (engine/threads.py)")
    scheduler: str = knob("continuous", "'static' (wait for the longest), 'continuous' (join/leave every step), "
                                        "'edge' (batch of one)")
    max_batch_size: int = knob(8, "most sequences in one step (vLLM: max_num_seqs)")
    batch_timeout_s: float = knob(0.0, "how long an idle engine waits to fill a batch before it starts")
    max_tokens_per_step: int = knob(512, "token budget of one step; longer prompts are prefilled in chunks (vLLM: "
                                         "max_num_batched_tokens)")
    block_size: int = knob(16, "tokens per KV block (vLLM: block_size)")
    num_kv_blocks: int | None = knob(None, "KV blocks in the pool; None derives it from kv_cache_memory_bytes")
    kv_cache_memory_bytes: int = knob(1 << 30, "memory budget for the KV cache when num_kv_blocks is None (1 GiB)")
    kv_layout: str = knob("paged", "'paged' allocates blocks as tokens arrive; 'contiguous' reserves max_model_len "
                                   "up front")
    enable_prefix_caching: bool = knob(False, "share the KV blocks of a prompt prefix already computed (a system "
                                              "prompt), and keep them after use")
    max_model_len: int | None = knob(None, "longest prompt + output; None takes the model's context, capped at 4096")
    quantization: str | None = knob(None, "weight format on CPU: None (fp32), 'q8_0' (8-bit blocks quantised at load), "
                                          "'q4_1' (the smollm2-135m GGUF file's own 4-bit blocks)")
    kernels: str = knob("auto", "'reference' (plain torch: the path to read first, any device and dtype), 'fast' "
                                "(compiled CPU kernels, float32 or bfloat16), 'auto' ('fast' where it applies)")
    attention_backend: str = knob("auto", "'auto' ('numba' on the fast path, 'torch' on the reference path), 'torch' "
                                          "(the readable reference), 'numba' (CPU kernels), 'numba-cuda' (GPU kernels)")
    clock: str = knob("real", "'real' wall-clock time; 'simulated' time from a cost model")
    sim_profile: str = knob("smollm2-135m-cpu", "clock='simulated': the cost model, a profile name or a JSON path; "
                                                "a name is your own profile (`python -m minibatch calibrate`, in "
                                                "the model cache) if you made one, else the shipped one")
    sim_skip_model: bool = knob(False, "clock='simulated': skip the model, emit placeholder tokens, run each request "
                                       "to max_new_tokens")
    seed: int = knob(0, "default seed for sampled requests that set none")
    profile_steps: bool = knob(False, "time each step's phases and layer types (synchronising on CUDA); off keeps "
                                      "steps lean")
    cuda_graphs: bool = knob(False, "replay decode steps from CUDA graphs captured per batch-size bucket (CUDA only; a "
                                    "no-op on CPU)")
    speculative_method: str | None = knob(None, "speculative decoding: None (off), 'ngram' (prompt lookup), "
                                                "'draft' (a smaller model), 'layer_skip'")
    num_speculative_tokens: int = knob(4, "draft tokens k proposed, then verified in one forward pass of the model")
    speculative_model: str | None = knob(None, "method 'draft': the draft model (same tokenizer), a registry name or "
                                               "a folder")
    speculative_layers: int | None = knob(None, "method 'layer_skip': layers the draft runs before the LM head; None "
                                                "takes half")
    speculative_adaptive: bool = knob(True, "each greedy request drafts the number (0 to num_speculative_tokens) "
                                            "that maximises its expected tokens per step over the measured step "
                                            "cost, none while drafting would slow it (sampled requests always draft "
                                            "num_speculative_tokens, so a seed repeats); False: always "
                                            "num_speculative_tokens")
    speculative_backoff_steps: int = knob(16, "speculative_adaptive: steps a request runs without drafts after "
                                              "switching off, before it probes again with one draft (doubled "
                                              "after each failed probe)")
    ngram_prompt_lookup_max: int = knob(4, "method 'ngram': the longest suffix n-gram looked up in the prompt and "
                                           "output")
    ngram_prompt_lookup_min: int = knob(1, "method 'ngram': the shortest one tried before giving up")
    scheduling_policy: str = knob("fcfs", "'fcfs' (arrival order), 'priority' (SamplingParams.priority, lower "
                                          "first, preempts), 'shortest_prompt' (aged)")
    aging_tokens_per_s: float = knob(100.0, "'shortest_prompt': each second waited counts as this many prompt tokens "
                                            "fewer; 0 ages nothing")
    long_prefill_token_threshold: int = knob(0, "most prompt tokens one request prefills in a step; 0: no cap but the "
                                                "budget (vLLM)")
    step_priority: str = knob("decode-first", "who takes a step's token budget first: 'decode-first' (the running "
                                              "requests, vLLM) or 'prefill-first' (prompts)")

    @property
    def batch_slots(self) -> int:
        """Sequences one step can hold: `max_batch_size`, or 1 with scheduler="edge" (one user at a time).
        The scheduler's slots, the KV pool's size, the CUDA-graph buckets and slot utilisation all read it."""
        return 1 if self.scheduler == "edge" else self.max_batch_size

    def __post_init__(self):
        owner = "EngineConfig"
        if not isinstance(self.model, str) or not self.model:
            fail(owner, "model", self.model, "a registry name, a local folder or a hub id")
        check_choice(owner, "device", self.device, DEVICES)
        if self.cpu_threads is not None:
            check_int(owner, "cpu_threads", self.cpu_threads, 1)
        check_choice(owner, "dtype", self.dtype, DTYPES)
        check_choice(owner, "scheduler", self.scheduler, SCHEDULERS)
        check_int(owner, "max_batch_size", self.max_batch_size, 1)
        check_number(owner, "batch_timeout_s", self.batch_timeout_s, 0.0)
        check_int(owner, "max_tokens_per_step", self.max_tokens_per_step, 1)
        check_int(owner, "block_size", self.block_size, 1)
        if self.num_kv_blocks is not None:
            check_int(owner, "num_kv_blocks", self.num_kv_blocks, 1)
        check_int(owner, "kv_cache_memory_bytes", self.kv_cache_memory_bytes, 1)
        check_choice(owner, "kv_layout", self.kv_layout, KV_LAYOUTS)
        if not isinstance(self.enable_prefix_caching, bool):
            fail(owner, "enable_prefix_caching", self.enable_prefix_caching, "True or False")
        if self.enable_prefix_caching and self.kv_layout != "paged":
            fail(owner, "enable_prefix_caching", True, f"False with kv_layout={self.kv_layout!r}: shared blocks need "
                  "the paged layout (a contiguous reservation belongs to one request); use kv_layout='paged'")
        if self.max_model_len is not None:
            check_int(owner, "max_model_len", self.max_model_len, 2)
        check_choice(owner, "kernels", self.kernels, KERNELS)
        check_choice(owner, "attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check_choice(owner, "quantization", self.quantization, QUANTIZATIONS)
        check_choice(owner, "clock", self.clock, CLOCKS)
        if not isinstance(self.sim_profile, str) or not self.sim_profile:
            fail(owner, "sim_profile", self.sim_profile, "a profile name (minibatch.sim.costmodel.list_profiles()) or a JSON path")
        if not isinstance(self.sim_skip_model, bool) or (self.sim_skip_model and self.clock != "simulated"):
            fail(owner, "sim_skip_model", self.sim_skip_model, "False, or True together with clock='simulated'")
        check_int(owner, "seed", self.seed, 0)
        self._check_policy(owner)
        self._check_speed_options(owner)

    def _check_policy(self, owner: str):
        """The scheduling policy, its aging rate, the per-request prefill cap and the step's priority."""
        check_choice(owner, "scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.scheduling_policy != "fcfs" and self.scheduler == "static":
            fail(owner, "scheduling_policy", self.scheduling_policy,
                  "'fcfs' with scheduler='static' (a static batch never admits or preempts mid-way); "
                  "other policies run with scheduler 'continuous' or 'edge'")
        check_number(owner, "aging_tokens_per_s", self.aging_tokens_per_s, 0.0)
        if self.aging_tokens_per_s == float("inf"):
            fail(owner, "aging_tokens_per_s", self.aging_tokens_per_s, "a finite number >= 0")
        check_int(owner, "long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        check_choice(owner, "step_priority", self.step_priority, STEP_PRIORITIES)
        if self.step_priority != "decode-first" and self.scheduler == "static":
            fail(owner, "step_priority", self.step_priority,
                  "'decode-first' with scheduler='static' (a static batch admits nobody while it decodes); "
                  "'prefill-first' runs with scheduler 'continuous' or 'edge'")

    def _check_speed_options(self, owner: str):
        """Profiling, CUDA graphs and speculative decoding: types, ranges and combinations."""
        for name in ("profile_steps", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                fail(owner, name, getattr(self, name), "True or False")
        if self.profile_steps and self.cuda_graphs:
            fail(owner, "profile_steps", True, "False when cuda_graphs=True (a captured graph cannot be timed layer by layer)")
        check_choice(owner, "speculative_method", self.speculative_method, SPECULATIVE_METHODS)
        check_int(owner, "num_speculative_tokens", self.num_speculative_tokens, 1)
        if not isinstance(self.speculative_adaptive, bool):
            fail(owner, "speculative_adaptive", self.speculative_adaptive, "True or False")
        check_int(owner, "speculative_backoff_steps", self.speculative_backoff_steps, 1)
        check_int(owner, "ngram_prompt_lookup_min", self.ngram_prompt_lookup_min, 1)
        check_int(owner, "ngram_prompt_lookup_max", self.ngram_prompt_lookup_max, self.ngram_prompt_lookup_min)
        if self.speculative_layers is not None:
            check_int(owner, "speculative_layers", self.speculative_layers, 1)
        if (self.speculative_method == "draft") != (self.speculative_model is not None):
            fail(owner, "speculative_model", self.speculative_model,
                  "a model name or folder exactly when speculative_method='draft', else None")
        if self.speculative_method and self.scheduler == "static":
            fail(owner, "speculative_method", self.speculative_method,
                  "None with scheduler='static'; speculative decoding runs with scheduler 'continuous' or 'edge'")
        if self.enable_prefix_caching and self.speculative_method == "draft":
            fail(owner, "enable_prefix_caching", True, "False with speculative_method='draft': the draft model's "
                  "own KV tensors are not shared; use speculative_method 'ngram' or 'layer_skip', or no prefix caching")
        if self.sim_skip_model and (self.speculative_method or self.profile_steps or self.cuda_graphs):
            fail(owner, "sim_skip_model", True, "False with speculative decoding, profile_steps or cuda_graphs: they need the real model")


MAX_LOGPROBS = 20                        # most top log-probabilities one token may return (vLLM's default max_logprobs)


def _check_range(owner: str, name: str, value, low: float, high: float, open_low: bool = False):
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or value != value
            or not (low < value if open_low else low <= value) or value > high):
        fail(owner, name, value, f"a number {'>' if open_low else '>='} {low:g}" if high == float("inf")
              else f"a number in {'(' if open_low else '['}{low:g}, {high:g}]")


@dataclass
class SamplingParams:
    """How one request chooses its tokens and when it stops: vLLM's fields, names and meanings.

    `prompt_logprobs` scores the prompt too (an evaluation harness's log-likelihood): as in vLLM, a request
    that asks computes every prompt token itself, reusing no cached prefix (enable_prefix_caching), since a
    prefix read from the cache has no logits; the blocks it fills are cached for the requests after it."""

    max_new_tokens: int = 16             # most tokens to generate (OpenAI/vLLM: max_tokens)
    min_tokens: int = 0                  # EOS and stop_token_ids are masked until this many tokens are out
    n: int = 1                           # continuations of the prompt, each sampled on its own (seed + i when seeded)
    temperature: float = 0.0             # 0 means greedy (argmax); higher flattens the distribution
    top_k: int = 0                       # keep only the k most likely tokens; 0 or -1 keeps all (vLLM)
    top_p: float = 1.0                   # keep the smallest set of tokens whose probability reaches top_p
    min_p: float = 0.0                   # drop tokens less likely than min_p times the most likely one
    repetition_penalty: float = 1.0      # > 1 discourages every token already in the prompt or output (multiplicative)
    presence_penalty: float = 0.0        # subtracted from the logit of every token already in the output
    frequency_penalty: float = 0.0       # subtracted once per occurrence of the token in the output
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling (OpenAI, -100..100)
    seed: int | None = None              # per-request seed: the same seed gives the same sample, whatever the batch
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # extra token ids that end the request
    ignore_eos: bool = False             # keep generating past the end-of-sequence token (for benchmarks)
    logprobs: int | None = None          # return each chosen token's log-probability and the top-N (raw model distribution)
    prompt_logprobs: int | None = None   # return each prompt token's log-probability and the top-N at its position (vLLM)
    priority: int = 0                    # lower is served earlier with scheduling_policy="priority"; else it must stay 0 (vLLM)

    def __post_init__(self):
        owner = "SamplingParams"
        check_int(owner, "max_new_tokens", self.max_new_tokens, 1)
        check_int(owner, "min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_new_tokens:
            fail(owner, "min_tokens", self.min_tokens, f"at most max_new_tokens={self.max_new_tokens}")
        check_int(owner, "n", self.n, 1)
        check_number(owner, "temperature", self.temperature, 0.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            fail(owner, "top_k", self.top_k, "an integer >= 1, or 0 or -1 to keep every token")
        _check_range(owner, "top_p", self.top_p, 0.0, 1.0, open_low=True)
        _check_range(owner, "min_p", self.min_p, 0.0, 1.0)
        _check_range(owner, "repetition_penalty", self.repetition_penalty, 0.0, float("inf"), open_low=True)
        _check_range(owner, "presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range(owner, "frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.logit_bias is not None and (not isinstance(self.logit_bias, dict) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 and isinstance(b, (int, float))
                and not isinstance(b, bool) and -100 <= b <= 100 for t, b in self.logit_bias.items())):
            fail(owner, "logit_bias", self.logit_bias, "None or a dict of token id (>= 0) -> bias in [-100, 100]")
        if self.seed is not None:
            check_int(owner, "seed", self.seed, 0)
        if isinstance(self.stop_token_ids, int) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            fail(owner, "stop_token_ids", self.stop_token_ids, "a sequence of non-negative token ids")
        self.stop_token_ids = tuple(self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            fail(owner, "ignore_eos", self.ignore_eos, "True or False")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            fail(owner, "logprobs", self.logprobs, f"None, or an integer in [0, {MAX_LOGPROBS}] (top log-probabilities per token)")
        if self.prompt_logprobs is not None and (isinstance(self.prompt_logprobs, bool) or not isinstance(
                self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            fail(owner, "prompt_logprobs", self.prompt_logprobs,
                 f"None, or an integer in [0, {MAX_LOGPROBS}] (top log-probabilities per prompt token)")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            fail(owner, "priority", self.priority, "an integer")
        # What the sampler asks of a request at every step, decided once (attributes, not fields):
        self.greedy = self.temperature == 0.0          # argmax, nothing drawn
        self.penalised = (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                          or self.frequency_penalty != 0.0)   # penalties need the request's token history

    def for_sample(self, index: int) -> "SamplingParams":
        """The params of the index-th of n continuations: one sample each; a seeded request's i-th gets seed + i (vLLM).
        The continuations share one prompt, so only the first scores it (`prompt_logprobs`)."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index,
                       prompt_logprobs=self.prompt_logprobs if index == 0 else None)
