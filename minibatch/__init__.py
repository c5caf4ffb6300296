"""minibatch: a compact, complete engine for serving small language models, built to be read.

    from minibatch import LLM, EngineConfig, SamplingParams
    llm = LLM(EngineConfig(model="tiny", scheduler="continuous", max_batch_size=8))
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_new_tokens=16))

Importing it first sets OMP_WAIT_POLICY=PASSIVE (unless already set), before torch loads: torch brings
its own OpenMP runtime and Numba's parallel kernels load the system's, and by default the idle threads
of each pool spin, taking the cores from the other pool's work and from everything else on a laptop.
Measured on a 2-core machine shared with other work: a q4_1 decode token 529 ms with spinning threads,
60 ms with passive ones (`python scripts/quant_ab.py` sets the same).
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # read by each OpenMP runtime when it loads: before torch

from minibatch.config import ConfigError, EngineConfig, SamplingParams  # noqa: E402
from minibatch.workloads import WorkloadRequest, load_workload, save_workload  # noqa: E402

__all__ = ["LLM", "EngineConfig", "SamplingParams", "ConfigError", "Plugins", "RequestOutput", "WorkloadRequest",
           "load_workload", "save_workload"]


def __getattr__(name):
    """`LLM`, `Plugins` and `RequestOutput` bring in torch and transformers, so they are imported when first used:
    `import minibatch.checks` or `minibatch.workloads` alone then starts in a moment."""
    if name in ("LLM", "Plugins", "RequestOutput"):
        from minibatch import llm
        return getattr(llm, name)
    raise AttributeError(f"module 'minibatch' has no attribute {name!r}")
