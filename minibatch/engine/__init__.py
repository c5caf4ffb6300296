"""The engine: what serves a request, step by step, and nothing else.

Requests (`request`), the step loop (`llm_engine.LLMEngine`) and its facade (`llm.LLM`), the
schedulers that decide who runs (`schedulers/`), the KV cache's blocks and tensors (`kv/`), the
model runner and the models it runs (`runner`, `models/`), attention kernels (`kernels/`),
sampling, speculative decoding and CUDA graphs. Nothing here imports the simulator, the analysis,
the server, the benchmarks or the course: they build on the engine, never the other way round.
"""
