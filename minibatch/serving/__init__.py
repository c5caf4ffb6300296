"""Serving: the OpenAI-compatible HTTP server, its monitoring and a load generator.

- server.py: `python -m minibatch serve`, which puts the pieces below together

- protocol.py: request bodies (pydantic) and response bodies in OpenAI's format, and `APIError`
- text.py: a request's output text as it grows, held back where a stop string might begin
- engine_thread.py: the engine's step loop in its own thread, and the door the event loop uses
- app.py: the FastAPI endpoints
- body_limit.py: refuses oversized bodies; flags.py: every EngineConfig field as a flag
- monitoring.py: the engine's metrics in Prometheus format, under vLLM's names
- loadtest.py: `python -m minibatch loadtest`, a workload replayed against any OpenAI-compatible server
"""
