"""Calibration: time the engine's own steps on this machine and fit the simulated clock's cost model.

    python -m minibatch calibrate                  # your own profile; the chapters use it from then on
    python -m minibatch calibrate --write-shipped  # the course's shipped profile (after an engine change)
    python -m minibatch calibrate --show           # the error table of the profile in use, no measuring

The engine is built as `EngineConfig()` builds it by default (device, dtype, threads and kernels
all "auto"), with room for 64 sequences of 1024 tokens. Decode steps of 1 to 64 sequences at a
short and a long context, and prefill steps of one prompt of 8 to 512 tokens, are timed in
interleaved rounds (`tools.step_timing`); each shape keeps its median. A step is timed on the
wall clock, or, when the engine runs on one thread (what it picks on a machine whose other core is
busy), in the CPU time of the process: what the step takes on an idle core, whatever else runs.
`sim.fit` fits the banded cost model (`sim.stepcost`) to them, and the error table shows, for every
batch size and context, the measured step, the model's and the error. The profile records what it was measured on (CPU,
threads, kernels, dtype, torch, date) and the fingerprint of the engine code (`sim.fingerprint`).
"""
from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import astuple, fields
from pathlib import Path

import torch

from minibatch.tools.step_timing import (CONTEXTS, DECODE_BATCHES, PREFILL_LENS, TIMERS, StepTimer, fixed_seconds,
                                           measure_grid)
from minibatch.config import EngineConfig
from minibatch.engine.kernels.gemv_blocks_cpu import BLOCK_ROWS, CHUNKED_ROWS
from minibatch.engine.kernels.gemv_cpu import STREAM_ROWS
from minibatch.sim.costmodel import PROFILE_DIR, StepShape, cost_model, load_profile, own_profile_dir, save_profile
from minibatch.sim.fingerprint import RECALIBRATE, engine_fingerprint
from minibatch.sim.fit import decode_table, fit_banded, fit_errors, prefill_table

# where the products switch paths (`engine.kernels.gemv_cpu`): the streamed loop takes up to BLOCK_ROWS rows,
# except that three rows are padded to four, which are blocks when BLOCK_ROWS is 3; blocks of four rows take
# columns in chunks up to CHUNKED_ROWS rows; oneDNN's GEMM runs above STREAM_ROWS
STREAMED_ROWS = BLOCK_ROWS - 1 if BLOCK_ROWS % 4 == 3 else BLOCK_ROWS
# and one more band where no path switches: up to about eight rows the blocks' multiply-adds hide under the
# reading of the weights (a step costs little more than one of a single row), past them they add to it
MEMORY_BOUND_ROWS = 8
ROW_BANDS = tuple(sorted({STREAMED_ROWS, MEMORY_BOUND_ROWS, CHUNKED_ROWS, STREAM_ROWS}))
BLOCK = 4   # rows in a block of the blocks path: its cost steps every four rows (three cost four)
ROW_GROUPS = tuple(BLOCK if STREAMED_ROWS <= low and high <= STREAM_ROWS else 1
                   for low, high in zip((0, *ROW_BANDS), (*ROW_BANDS, float("inf"))))
SHIPPED = PROFILE_DIR / f"{EngineConfig.sim_profile}.json"


def cpu_model() -> str:
    """The CPU's model name as the system reports it (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(timer: StepTimer) -> dict:
    """What the steps were measured on: the chip, the threads and the engine's choices."""
    engine = timer.llm.engine
    on_gpu = engine.device.type == "cuda"
    return {"processor": torch.cuda.get_device_name() if on_gpu else cpu_model(), "cpus": os.cpu_count(),
            "threads": engine.cpu_threads, "device": engine.device.type, "dtype": str(engine.dtype).split(".")[1],
            "attention_backend": engine.attention_backend, "quantization": engine.config.quantization,
            "whole_layers": bool(getattr(engine.model, "whole_layers", False)),
            "torch": torch.__version__, "python": platform.python_version()}


def calibrate(model: str = "smollm2-135m", rounds: int = 5, name: str | None = None, use_tqdm: bool = True,
              batches=DECODE_BATCHES, contexts=CONTEXTS, prefill_lens=PREFILL_LENS, timer: str = "auto") -> dict:
    """Measure, fit and describe: a profile dict ready for `save_profile` and `EngineConfig(sim_profile=...)`."""
    start = time.perf_counter()
    timer = StepTimer(model, max(batches), max(contexts), timer=timer)
    points = measure_grid(timer, batches, contexts, prefill_lens, rounds=rounds, use_tqdm=use_tqdm)
    fitted = fit_banded(points, ROW_BANDS, fixed_seconds(timer), ROW_GROUPS)
    about = machine(timer) | {"timer": "CPU time of the process" if timer.timer == "cpu" else "wall clock"}
    return {
        "name": name or EngineConfig.sim_profile, "kind": "measured",
        "description": f"MEASURED: {model}, {about['dtype']}, attention {about['attention_backend']!r}, "
                       f"{about['threads']} thread(s) of {about['processor']} ({about['cpus']} CPUs), "
                       f"{about['timer']}, "
                       f"medians of {rounds} interleaved rounds; fitted by `python -m minibatch calibrate`",
        "model": model, "date": datetime.date.today().isoformat(), "machine": about,
        "engine_fingerprint": engine_fingerprint(), "rounds": rounds,
        "measure_seconds": round(time.perf_counter() - start, 1),
        "row_bands": list(fitted.row_bands), "row_groups": list(fitted.row_groups),
        "coefficients": fitted.coefficients(),
        "fit": fit_errors(fitted, points),
        "measured_steps": {"fields": [*(f.name for f in fields(StepShape)), "seconds"],
                           "rows": [[*astuple(s), t] for s, t in points]},
    }


def measured_points(profile: dict) -> list[tuple[StepShape, float]]:
    rows = profile["measured_steps"]["rows"]
    return [(StepShape(*map(int, row[:-1])), float(row[-1])) for row in rows]


def report(profile: dict) -> str:
    """The profile's model in words and its error table: decode steps by batch and context, then prefills."""
    model, points = cost_model(profile), measured_points(profile)
    table = decode_table(model, points)
    contexts = sorted({r["context"] for r in table})
    lines = [profile["description"], f"engine fingerprint {profile.get('engine_fingerprint')}, {profile.get('date')}"]
    lines.append("decode steps, measured against the cost model (ms):")
    lines.append(f"{'batch':>5}" + "".join(f" | {'ctx ' + str(c):>8} {'model':>7} {'error':>6}" for c in contexts))
    by_cell = {(r["batch"], r["context"]): r for r in table}
    for batch in sorted({r["batch"] for r in table}):
        cells = [by_cell.get((batch, c)) for c in contexts]
        lines.append(f"{batch:>5}" + "".join(
            f" | {r['measured_s'] * 1e3:>8.1f} {r['model_s'] * 1e3:>7.1f} {r['error']:>+6.1%}" if r else " |" + " " * 23
            for r in cells))
    lines.append("prefill steps (one prompt), measured against the cost model (ms):")
    lines += [f"{r['prefill_tokens']:>5} tokens | {r['measured_s'] * 1e3:>8.1f} {r['model_s'] * 1e3:>7.1f} "
              f"{r['error']:>+6.1%}" for r in prefill_table(model, points)]
    worst = max(abs(r["error"]) for r in table)
    lines.append(f"worst decode error {worst:.1%} (goal: within 10% at every batch size and context); "
                 f"all {len(points)} shapes: median {profile['fit']['median_rel_error']:.1%}")
    if hasattr(model, "terms"):
        terms = model.terms(StepShape(decode_seqs=1, kv_tokens_read=64, attention_pairs=64, sampled_rows=1))
        lines.append("a decode step of one sequence at 64 tokens: " +
                     ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in terms.items()))
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="model to measure (default: smollm2-135m)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the grid (medians kept)")
    parser.add_argument("--out", default=None, help="where to write the profile JSON (default: your own profile "
                                                    f"in the model cache, {own_profile_dir()}/)")
    parser.add_argument("--write-shipped", action="store_true", help=f"write the course's shipped profile {SHIPPED}")
    parser.add_argument("--timer", choices=TIMERS, default="auto",
                        help="'wall' clock, 'cpu' time of the process (an idle core's time, for an engine on one "
                             "thread of a busy machine) or 'auto' (cpu when the engine runs on one thread)")
    parser.add_argument("--show", nargs="?", const=EngineConfig.sim_profile, default=None, metavar="PROFILE",
                        help="print the error table of a profile (default: the one chapters use) and exit")


def main(args) -> int:
    if args.show:
        print(report(load_profile(args.show)))
        return 0
    if args.write_shipped:
        out = SHIPPED
    else:
        default_name = EngineConfig.sim_profile if args.model == EngineConfig.model else f"{args.model}-cpu"
        out = Path(args.out) if args.out else own_profile_dir() / f"{default_name}.json"
    profile = calibrate(args.model, args.rounds, name=out.stem, timer=args.timer)
    save_profile(profile, out)
    print(report(profile))
    print(f"measured and fitted in {profile['measure_seconds']:.0f} s; saved {out}")
    if args.write_shipped:
        print(f"the shipped profile now matches the engine code ({RECALIBRATE} made it)")
    else:
        print(f"EngineConfig(clock='simulated', sim_profile={out.stem!r}) and the chapters now use it"
              if out.parent == own_profile_dir() else f"use it with EngineConfig(sim_profile={str(out)!r})")
    return 0
