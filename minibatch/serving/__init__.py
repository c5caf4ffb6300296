"""The OpenAI-compatible HTTP server, in pieces: `python -m minibatch serve` (minibatch/server.py) puts them together.

- protocol.py: request bodies (pydantic) and response bodies in OpenAI's format, and `APIError`
- text.py: a request's output text as it grows, held back where a stop string might begin
- engine_thread.py: the engine's step loop in its own thread, and the door the event loop uses
- app.py: the FastAPI endpoints
- body_limit.py: refuses oversized bodies; flags.py: every EngineConfig field as a flag
"""
