"""What each chapter needs in memory: the peak resident memory of its kernel, measured, for `doctor --memory`.

Each chapter of notebooks/ ran alone under nbval on a 2-core CPU machine with torch 2.13.0+cpu, and GNU
time read the peak resident memory of its largest process, the kernel (docs/instructors.md, "Memory per
chapter", gives the command). Chapters are named without their number, so the table survives a
renumbering. Beside the kernel, JupyterLab's server and a browser tab take about another GiB.
"""
from __future__ import annotations

GIB = 2 ** 30
DESKTOP_GIB = 1.5   # JupyterLab's server, a browser tab and the operating system's own share, besides the kernel

PEAK_GIB: dict[str, float | None] = {   # chapter (its notebook's name without the number) -> kernel's peak, GiB
    "welcome": 2.5,
    "why_batch": 3.0,
    "static_batching": 2.5,
    "continuous_batching": 2.6,
    "throughput_vs_latency": 2.7,
    "prefill_vs_decode": 2.8,
    "kv_cache_and_memory": 1.7,
    "prefix_caching": 3.0,
    "kernels": 2.7,
    "small_model_specifics": 5.7,     # tiny, 135M and the first layers of the 360M and 1.7B shapes side by side
    "edge_batch_of_one": 5.2,         # several SmolLM2-135M engines side by side (server, edge, speculative)
    "batching_config_and_sla": 2.6,
    "monitoring": 1.6,
    "slm_vs_llm_batching": 3.1,
    "serving_over_http": 2.6,         # its server process holds another copy of the model (about 1 GiB)
    "capstone": 1.6,
    "playground": 0.5,
}
# settings a chapter leaves off by default because they need more memory than a laptop has: none at present
# (small_model_specifics builds only the first 4 layers of the SmolLM2-1.7B shape, which whole peaked at 15.1 GiB)
OPTIONAL_PEAK_GIB: dict[str, float] = {}


def measured() -> dict[str, float]:
    """The chapters with a measured peak, optional settings included."""
    return {name: peak for name, peak in {**PEAK_GIB, **OPTIONAL_PEAK_GIB}.items() if peak is not None}


def largest() -> tuple[str, float]:
    """(chapter, peak GiB) of the chapter that needs the most memory by default."""
    peaks = {name: peak for name, peak in PEAK_GIB.items() if peak is not None}
    name = max(peaks, key=peaks.get)
    return name, peaks[name]


def chapters_over(gib: float) -> list[str]:
    """The chapters (optional settings included) whose kernel alone peaks above `gib`."""
    return [name for name, peak in measured().items() if peak > gib]


def table() -> str:
    """One line per chapter: its peak, and what a machine needs for it with JupyterLab and a browser."""
    rows = [f"{'chapter':<46} {'kernel peak':>11} {'machine RAM':>11}"]
    for name, peak in {**PEAK_GIB, **OPTIONAL_PEAK_GIB}.items():
        rows.append(f"{name:<46} {'not measured':>11}" if peak is None else
                    f"{name:<46} {peak:>7.1f} GiB {peak + DESKTOP_GIB:>7.1f} GiB")
    return "\n".join(rows)
