"""The engine: what serves a request, step by step, and nothing else.

Requests (`request`), the step loop (`llm_engine.LLMEngine`) and the parts it is built from
(`parts`), the schedulers that decide who runs (`schedulers/`), the KV cache's blocks and tensors
(`kv/`), the model runner and the models it runs (`runner`, `models/`), attention kernels
(`kernels/`), sampling, speculative decoding, CUDA graphs, the clock interface, the step records
and the step timers. Nothing here imports the simulator, the workloads, the analysis, the server,
the benchmarks or the course: they build on the engine, never the other way round. The simulator
plugs in through the engine's own interfaces (`parts.ModelParts`, `clock.Clock`); `minibatch.llm`
joins the wings.
"""
from minibatch.engine import numba_target  # noqa: F401  (first: it sets what Numba compiles for)
