"""llama.cpp's own HTTP server, `llama-server`, on the default model with minibatch's knobs mapped to its
flags, so one load test can run against it beside `minibatch serve` and `vllm serve`.

Unlike the llama.cpp peer of the bench (llama-cpp-python, one request at a time), llama-server batches
continuously: `-np` slots decode together, and with `--kv-unified` they share one KV pool of `-c` tokens.
`make peer-llamaserver` builds it from the llama.cpp that llama-cpp-python vendors into
`.peers/llamaserver/bin/` (never part of lab, test or CI); `llama_server_executable()` finds it there,
under `$MINIBATCH_PEERS/llamaserver`, or wherever `MINIBATCH_LLAMA_SERVER` points.

The knob map (chapter 14 tabulates it): max_batch_size -> -np (slots), the KV pool -> -c = slots x
max_model_len with --kv-unified, max_tokens_per_step -> -b / -ub (tokens per decode call), threads -> -t / -tb.
Prefix caching has no server switch that matches ours: each slot keeps its last prompt's KV and reuses its
longest common prefix unless a request sends `"cache_prompt": false`; `--cache-reuse N` also reuses chunks of
at least N tokens found further along (KV shifting), and stays off here.

Weights: the F32 copy of the shipped GGUF that the llama.cpp peer's converter writes (the weights minibatch
serves, dequantised), made with `make peer-llamacpp`'s llama.cpp when it is installed; else the shipped
Q4_1 file, the format it comes in. The KV cache is F32, as minibatch's.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from minibatch.bench.peers.external import RUNNERS, install_hint, peer_python, peers_dir
from minibatch.config import EngineConfig
from minibatch.engine.models.smollm2 import gguf_path, model_cache_dir
from minibatch.engine.threads import free_threads
from minibatch.serving.child import ChildServer, free_port

FORMATS = ("f32", "q4_1")
# Runs in the llama.cpp peer's Python: its runner's converter (llama.cpp's own quantizer) writes the F32 copy.
CONVERT = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
           "from llamacpp_runner import gguf_in_format; "
           "gguf_in_format(Path(sys.argv[2]), 'f32', Path(sys.argv[3]), int(sys.argv[4]))")


def llama_server_executable() -> Path | None:
    """The `llama-server` of `make peer-llamaserver` (or $MINIBATCH_LLAMA_SERVER, or under $MINIBATCH_PEERS),
    or None when it is not installed."""
    override = os.environ.get("MINIBATCH_LLAMA_SERVER")
    path = Path(override or peers_dir() / "llamaserver" / "bin" / "llama-server")
    installed = override or (peers_dir() / "llamaserver" / ".installed").exists()
    return path if installed and path.is_file() and os.access(path, os.X_OK) else None


def f32_gguf_path() -> Path:
    """Where the llama.cpp peer keeps its F32 copy of the shipped GGUF (LlamaCpp("f32") writes the same file)."""
    return model_cache_dir() / "gguf" / gguf_path().name.replace(".Q4_1.gguf", ".F32.gguf")


def default_format() -> str:
    """'f32' when the F32 copy exists or the llama.cpp peer can write it, else 'q4_1' (the shipped file)."""
    return "f32" if f32_gguf_path().is_file() or peer_python("llamacpp") is not None else "q4_1"


def served_gguf(fmt: str, threads: int) -> Path:
    """The GGUF file to serve in `fmt`; the F32 copy is written once (about a minute) if it is not there yet."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not allowed: {', '.join(FORMATS)}")
    if fmt == "q4_1":
        return gguf_path()
    target = f32_gguf_path()
    if not target.is_file():
        python = peer_python("llamacpp")
        if python is None:
            raise FileNotFoundError(f"fmt='f32' needs {target}, written by the llama.cpp peer, which is "
                                    f"{install_hint('llamacpp')}; or serve fmt='q4_1'")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}    # the peer's environment, not ours
        subprocess.run([str(python), "-c", CONVERT, str(RUNNERS), str(gguf_path()), str(target.parent),
                        str(threads)], check=True, capture_output=True, env=env)
    return target


def llama_server_flags(config: EngineConfig, gguf: Path, threads: int, host: str, port: int,
                       served_name: str = "smollm2-135m") -> list[str]:
    """`llama-server` flags that match an EngineConfig serving the default model on the CPU."""
    if config.model != "smollm2-135m":
        raise ValueError(f"model={config.model!r}: the side-by-side run serves the default model, 'smollm2-135m'")
    slots = config.batch_slots
    max_model_len = config.max_model_len or 2048            # as the vLLM side-by-side takes it
    tokens_per_call = str(max(config.max_tokens_per_step, slots))
    return ["-m", str(gguf), "--alias", served_name,
            "-np", str(slots), "-c", str(slots * max_model_len), "--kv-unified",
            "-b", tokens_per_call, "-ub", tokens_per_call,
            "-t", str(threads), "-tb", str(threads),
            "--cache-type-k", "f32", "--cache-type-v", "f32",
            "--metrics", "--host", host, "--port", str(port)]


class LlamaServer(ChildServer):
    """`llama-server` in a child process on a free loopback port, configured like `config`."""

    def __init__(self, config: EngineConfig, fmt: str | None = None, host: str = "127.0.0.1",
                 ready_timeout_s: float = 600):
        executable = llama_server_executable()
        if executable is None:
            raise FileNotFoundError(f"llama-server is {install_hint('llamaserver')}")
        threads = config.cpu_threads or free_threads()      # as minibatch's engine takes them
        self.fmt = fmt or default_format()
        port = free_port(host)
        command = [str(executable), *llama_server_flags(config, served_gguf(self.fmt, threads), threads, host, port)]
        super().__init__(command, f"http://{host}:{port}", dict(os.environ), ready_timeout_s, "llama-server-")
