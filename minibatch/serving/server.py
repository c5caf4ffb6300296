"""`python -m minibatch serve`: the engine behind an OpenAI-compatible HTTP API.

    python -m minibatch serve --model smollm2-135m --port 8000 --max-batch-size 16

Every EngineConfig field is a flag (`--help` lists them). Then any OpenAI client talks to it:

    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "smollm2-135m", "prompt": "The tide comes in", "max_tokens": 16}'

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}])

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with "stream": true for
server-sent events, and vLLM's sampling fields: top_k, min_p, the penalties, min_tokens, logprobs,
n, ...; completions also take "echo": true, with "logprobs" the prompt's tokens scored first and
"max_tokens": 0 for the prompt alone, as evaluation harnesses send it, and vLLM's "prompt_logprobs"),
GET /v1/models, GET /health, GET /metrics (Prometheus, vLLM's names with a `minibatch:`
prefix), and vLLM's POST /tokenize, POST /detokenize, GET /version. So vLLM's own clients work:

    vllm bench serve --backend openai --base-url http://127.0.0.1:8000 --model smollm2-135m ...

The pieces live in `minibatch/serving/`: the wire format (protocol.py, responses.py), the engine
thread (engine_thread.py), the endpoints (app.py, utilities.py).

The engine takes the cores other programs leave free, as `LLM` does (--cpu-threads fixes the count).
It is built in a thread of its own that ends before serving starts (`engine.threads.built_apart`), so
the engine thread's OpenMP workers are the only ones in the process: built in the main thread, its
decode steps took 1.6-2x as long (p50 TPOT 47 against 27-29 ms at 1 req/s, SmolLM2-135M, 2 cores).
The event loop and the clients share those cores, so the engine thread hands each step's updates to
the event loop in one call, which wakes it once per step. Measured here (2 cores, 48 requests at
4 and 8 req/s, 16 sequences at most, interleaved rounds): with one call per step, goodput 2.71 and
2.89 req/s at 4 req/s with two engine threads against 1.81 and 1.30 with one (a core kept for the
front end, as vLLM's CPU backend keeps one); at 8 req/s 0.98 and 1.20 against 0.85 and 0.84.

On SIGTERM (or Ctrl-C) the server stops accepting connections, lets in-flight requests finish for
up to --shutdown-timeout seconds, ends the rest with an error, and exits with status 0.
`ServerProcess` starts a server in a child process on a free loopback port, for notebooks and tests.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import uvicorn

from minibatch.config import ConfigError, EngineConfig
from minibatch.engine.threads import built_apart
from minibatch.serving.child import ChildServer, free_port
from minibatch.llm import make_engine
from minibatch.serving.monitoring import engine_metrics
from minibatch.serving.app import OpenAIServer, build_app
from minibatch.serving.body_limit import BodyLimit
from minibatch.serving.flags import add_engine_arguments, engine_config_from_args

MAX_WAITING = 128                  # queued requests before new ones get 429
MAX_BODY_BYTES = 1 << 20           # 1 MiB: far more than a prompt of max_model_len tokens needs
SHUTDOWN_TIMEOUT_S = 30.0          # on SIGTERM, how long in-flight requests may still run


def build_server(config: EngineConfig, model_name: str | None = None, max_waiting: int = MAX_WAITING,
                 max_body_bytes: int = MAX_BODY_BYTES, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S):
    """The ASGI app serving `config`'s model (the engine thread starts with the app)."""
    if config.clock != "real":
        raise ConfigError(f"EngineConfig.clock={config.clock!r} is not allowed for a server: it serves in real time, use 'real'")
    engine = built_apart(lambda: make_engine(config))   # the engine thread drives it: see built_apart
    metrics = engine_metrics(engine)    # made before the first step, so it counts every one
    server = OpenAIServer(engine, model_name or config.model, max_waiting, shutdown_timeout_s,
                          on_abort=metrics.observe_finished)
    return BodyLimit(build_app(server, metrics.exposition), max_body_bytes)


class Uvicorn(uvicorn.Server):
    """uvicorn, plus: the moment shutdown begins, the engine starts draining (see EngineThread.stop)."""

    async def shutdown(self, sockets=None):
        server = self.config.app.state.server
        server.worker.stop(server.shutdown_grace_s)
        await super().shutdown(sockets)


def add_arguments(parser) -> None:
    add_engine_arguments(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    group.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    group.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: --model)")
    group.add_argument("--max-waiting", type=int, default=MAX_WAITING,
                       help=f"queued requests beyond which new ones get 429 (default: {MAX_WAITING})")
    group.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                       help=f"largest request body accepted, else 413 (default: {MAX_BODY_BYTES})")
    group.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S,
                       help=f"seconds in-flight requests may run after SIGTERM (default: {SHUTDOWN_TIMEOUT_S})")
    group.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")


def main(args) -> int:
    for name in ("max_waiting", "max_body_bytes"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')}={getattr(args, name)} is not allowed: an integer >= 1", file=sys.stderr)
            return 2
    try:
        app = build_server(engine_config_from_args(args), args.served_model_name, args.max_waiting,
                           args.max_body_bytes, max(0.0, args.shutdown_timeout))
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    server = Uvicorn(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    # uvicorn re-raises the signal that stopped it once it is done; by then shutdown was graceful,
    # so that signal should end the process with status 0, not kill it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    print(f"serving {app.state.server.model_name} on http://{args.host}:{args.port}/v1", flush=True)
    server.run()
    return 0


class ServerThread:
    """A server in a thread of this process, for tests and for looking at the engine while it serves. Its
    decode steps are slower than `ServerProcess`'s when this process's main thread has run torch's parallel
    work before (its OpenMP team stays beside the engine thread's: see `engine.threads.built_apart`).

        with ServerThread(EngineConfig(model="tiny")) as server:
            server.engine.blocks.num_free_blocks; httpx.get(server.url + "/health")
    """

    def __init__(self, config: EngineConfig, host: str = "127.0.0.1", port: int | None = None, **options):
        self.app = build_server(config, **options)
        self.engine = self.app.state.server.engine
        self.url = f"http://{host}:{port or free_port(host)}"
        self.server = Uvicorn(uvicorn.Config(self.app, host=host, port=int(self.url.rsplit(":", 1)[1]), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.01)

    def stop(self) -> None:
        """What SIGTERM does: stop accepting, drain for shutdown_timeout_s, end."""
        self.server.should_exit = True
        self.thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ServerProcess(ChildServer):
    """`python -m minibatch serve <flags>` in a child process on a free loopback port.

        with ServerProcess("--model", "tiny") as server:
            httpx.get(server.url + "/health")
    """

    def __init__(self, *flags: str, host: str = "127.0.0.1", port: int | None = None, ready_timeout_s: float = 300):
        port = port or free_port(host)
        command = [sys.executable, "-m", "minibatch", "serve", "--host", host, "--port", str(port), *flags]
        here = str(Path(__file__).resolve().parent.parent)    # run this very minibatch, installed or not
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
        super().__init__(command, f"http://{host}:{port}", env, ready_timeout_s, "minibatch-serve-")
