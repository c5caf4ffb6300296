"""minibatch: a compact, complete engine for serving small language models, built to be read.

    from minibatch import LLM, EngineConfig, SamplingParams
    llm = LLM(EngineConfig(model="tiny", scheduler="continuous", max_batch_size=8))
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_new_tokens=16))
"""
from minibatch.config import ConfigError, EngineConfig, SamplingParams
from minibatch.workloads import WorkloadRequest, load_workload, save_workload

__all__ = ["LLM", "EngineConfig", "SamplingParams", "ConfigError", "Plugins", "RequestOutput", "WorkloadRequest",
           "load_workload", "save_workload"]


def __getattr__(name):
    """`LLM`, `Plugins` and `RequestOutput` bring in torch and transformers, so they are imported when first used:
    `import minibatch.checks` or `minibatch.workloads` alone then starts in a moment."""
    if name in ("LLM", "Plugins", "RequestOutput"):
        from minibatch import llm
        return getattr(llm, name)
    raise AttributeError(f"module 'minibatch' has no attribute {name!r}")
