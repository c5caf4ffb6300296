"""Serving: the OpenAI-compatible HTTP server, its monitoring and a load generator.

- server.py: `python -m minibatch serve`, which puts the pieces below together
- protocol.py: request bodies (pydantic) with vLLM's sampling fields, and `APIError`
- responses.py: response bodies and chunks in OpenAI's format, log-probabilities included
- reply.py: one response as its n continuations report in
- utilities.py: vLLM's /tokenize, /detokenize and /version
- text.py: a request's output text as it grows, held back where a stop string might begin
- engine_thread.py: the engine's step loop in its own thread, and the door the event loop uses
- app.py: the FastAPI endpoints
- body_limit.py: refuses oversized bodies; flags.py: every EngineConfig field as a flag
- monitoring.py: the engine's metrics in Prometheus format, under vLLM's names
- loadtest.py: `python -m minibatch loadtest`, a workload replayed against any OpenAI-compatible server
"""
