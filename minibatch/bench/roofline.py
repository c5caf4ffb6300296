"""The physical limit: how fast this machine could possibly decode, and how close minibatch gets.

A decode step must read every weight once and every cached key and value of the batch, and must
do 2 FLOPs per weight per sequence (plus the attention products). So its time is at least

    bytes moved / memory bandwidth      (the memory bound: what limits small batches)
    FLOPs / peak FLOP/s                 (the compute bound: what limits large batches)

Both peaks are measured here, on this machine: bandwidth as the speed of copying a tensor much
larger than the CPU's caches, peak FLOP/s as the speed of a large fp32 matrix product. The bytes
and FLOPs of a step come from `minibatch.sim.costmodel` (the roofline cost model, with the measured
peaks, full efficiency and no overhead). Beside each bound, the bandwidth a step achieved (the
bytes it must read / its measured time) and how much more a step of 8 sequences costs than a step
of 1 (about 1.0x while reading the weights dominates). Also measured: the engine's own time per
step, outside the model's forward pass (scheduling, input preparation, sampling, bookkeeping).
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch
import transformers

from minibatch.config import EngineConfig, SamplingParams
from minibatch.analysis.roofline import bounds
from minibatch.sim.costmodel import ModelSize
from minibatch.engine.kv import blocks_for
from minibatch.llm import LLM
from minibatch.tools.profile import profile_decode

COPY_BYTES = 256 << 20   # size of the copied tensor: far larger than any CPU cache
OVERHEAD_BATCH = 32      # batch size at which the engine's overhead share is measured


def machine() -> dict:
    """What the benchmark ran on."""
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    native_bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "native_bf16": native_bf16, "torch_threads": torch.get_num_threads(), "gpu": gpu,
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "load_average_1min": os.getloadavg()[0]}


def _best_time(fn, repeats: int, device: str = "cpu") -> float:
    wait = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)  # GPU work is asynchronous
    fn()                                              # warm-up: page faults, thread pool start
    wait()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - start)
    return min(times)                                 # the machine's speed when nothing interfered


def memory_bandwidth(num_bytes: int = COPY_BYTES, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes per second of a large tensor copy on `device` (each byte read once and written once)."""
    src = torch.ones(num_bytes // 4, device=device)   # (N,) fp32
    dst = torch.empty_like(src)
    return 2 * num_bytes / _best_time(lambda: dst.copy_(src), repeats, device)


def peak_flops(n: int = 2048, repeats: int = 3, device: str = "cpu") -> float:
    """FLOP/s of an n x n x n fp32 matrix product on `device` (2 n^3 FLOPs)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)   # (n, n) each
    return 2 * n ** 3 / _best_time(lambda: torch.mm(a, b), repeats, device)


def decode_records(llm: LLM, batch_size: int, steps: int, prompt_tokens: int) -> list:
    """The decode-only step records of batch_size sequences of prompt_tokens generating steps + 1 tokens together."""
    vocab = llm.engine.model.vocab_size
    prompts = [[(97 * i + 31 * j) % (vocab - 16) + 8 for j in range(prompt_tokens)] for i in range(batch_size)]
    first = len(llm.engine.step_records)
    llm.generate(prompts, SamplingParams(max_new_tokens=steps + 1, ignore_eos=True), use_tqdm=False)
    records = [s for s in llm.engine.step_records[first:] if s.num_prefill_tokens == 0 and s.batch_size == batch_size]
    if not records:
        raise RuntimeError(f"no decode step ran all {batch_size} sequences together: raise max_tokens_per_step")
    return records


def measure(model: str, model_config, batch_sizes=(1, 8, 64), steps: int = 8, prompt_tokens: int = 32,
            gemm_size: int = 2048, device: str = "auto", attention_backend: str = "auto", rounds: int = 1) -> dict:
    """Peak bandwidth and FLOP/s, minibatch's decode step at each batch size against its bounds, and
    the engine's overhead share at OVERHEAD_BATCH. model_config is the model's Hugging Face config.
    The batch sizes take turns over `rounds` rounds (1, 8, 64, 1, 8, 64, ...), so a machine whose
    speed drifts slows them alike, and each step time is the median over all its rounds' steps."""
    on = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    bandwidth, flops = memory_bandwidth(device=on), peak_flops(gemm_size, device=on)   # of the engine's device
    most = max(*batch_sizes, OVERHEAD_BATCH)
    max_len = prompt_tokens + steps + 2
    config = dict(model=model, device=device, attention_backend=attention_backend, max_batch_size=most,
                  cpu_threads=torch.get_num_threads(),                          # the bench's count, not the free cores
                  max_model_len=max_len, block_size=16, num_kv_blocks=most * blocks_for(max_len, 16),
                  max_tokens_per_step=most * prompt_tokens)     # every prompt in one step: then all decode together
    llm = LLM(EngineConfig(**config))
    decode_records(llm, 1, 2, prompt_tokens)                                    # warm-up
    size, value_bytes = ModelSize.of(model_config), llm.engine.kv_cache.k[0].element_size()
    taken = {batch: [] for batch in batch_sizes}
    for _ in range(rounds):
        for batch in batch_sizes:
            taken[batch] += decode_records(llm, batch, steps, prompt_tokens)
    decode = []
    for batch, records in taken.items():
        step_s = float(np.median([r.duration for r in records]))
        context = int(np.median([r.kv_tokens_stored for r in records]))
        b = bounds(size, value_bytes, flops, bandwidth, batch, context)
        bytes_read = b["memory_bound_s"] * bandwidth                            # weights + the batch's KV, once
        decode.append({"batch_size": batch, "step_s": step_s, "steps_timed": len(records),
                       "context_tokens": context, **b, "bytes_read": bytes_read, "achieved_Bps": bytes_read / step_s,
                       "fraction_of_memory_bound": b["memory_bound_s"] / step_s,
                       "fraction_of_bound": b["bound_s"] / step_s})
    step_s = {d["batch_size"]: d["step_s"] for d in decode}
    records = decode_records(llm, OVERHEAD_BATCH, steps, prompt_tokens)
    phases = {k: float(np.median([r.phase_times[k] for r in records]))
              for k in ("schedule", "model", "sample", "update")}
    del llm
    profiled = LLM(EngineConfig(**config, profile_steps=True))
    profile_decode(profiled, 1, 2, prompt_tokens)                               # warm-up
    profile = profile_decode(profiled, OVERHEAD_BATCH, steps, prompt_tokens)
    parts = profile["parts"]
    engine = parts["schedule"] + parts["prepare"] + parts["sample"] + parts["update"]
    overhead = {"batch_size": OVERHEAD_BATCH, "phases_s": phases,
                "outside_model_share": 1 - phases["model"] / sum(phases.values()),
                "profile_parts_s": parts, "engine_share": engine / profile["step_s"],
                "profiler_overhead_share": profile["overhead_share"]}
    return {"memory_bandwidth_Bps": bandwidth, "peak_flops": flops, "gemm_size": gemm_size,
            "weight_bytes": (size.body_params + size.lm_head_params) * value_bytes,
            "kv_bytes_per_token": size.kv_values_per_token * value_bytes, "decode": decode,
            "step_8_over_1": step_s[8] / step_s[1] if {1, 8} <= set(step_s) else None, "overhead": overhead}
