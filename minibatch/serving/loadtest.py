"""`python -m minibatch loadtest`: replay a workload against any OpenAI-compatible server, measured from the client.

    python -m minibatch loadtest --url http://127.0.0.1:8000 --num-requests 100 --rate 4 --output-len 32
    python -m minibatch loadtest --url http://127.0.0.1:8000 --users 8 --num-requests 100   # closed loop
    python -m minibatch loadtest --url http://127.0.0.1:8000 --workload trace.jsonl

Each request is sent at its arrival time (open loop: Poisson or a trace) or when one of N users
is ready (closed loop), always streaming, and timed on the client: TTFT (sent to the first chunk
that carries tokens, with or without text, as vLLM's benchmark client counts it and as the engine
counts its own first token), inter-token latency (the gaps between those chunks), TPOT
((last - first chunk) / (tokens - 1), with the token count from the server's `usage`) and e2e
latency. The summary has the same names as the engine's own `RunReport.summary()`, so an offline
run and a run over HTTP compare line by line; the difference is what HTTP, JSON and the event
loop cost per request.

It speaks only the OpenAI API (`/v1/completions` for text and token-id prompts, `/v1/chat/completions`
for chats, `stream_options.include_usage` for token counts), so it measures other servers too:
- vLLM:        vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8000
- SGLang:      python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct --port 8000
- llama.cpp:   llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --port 8000
then `--url http://127.0.0.1:8000` (and `--model NAME` if the server does not list it in /v1/models).
A workload's sampling fields beyond OpenAI's (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
`ignore_eos`, `stop_token_ids`, ...) are sent under vLLM's names when they differ from the default,
which vLLM, SGLang and llama.cpp accept; a strict OpenAI endpoint may reject them.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from tqdm.auto import tqdm

from minibatch.config import ConfigError, SamplingParams
from minibatch.workloads.distributions import AllAtOnce, Fixed, LogNormal, Poisson
from minibatch.analysis.metrics import RunReport, percentile
from minibatch.engine.records import RequestMetrics
from minibatch.analysis.sla import SLA, evaluate
from minibatch.workloads import ClosedLoop, WorkloadRequest, load_workload, make_workload


@dataclass
class LoadReport(RunReport):
    """What the client saw: one RequestMetrics per request (e2e None if it failed), the gaps between
    streamed chunks, and the errors. A RunReport without steps, so `minibatch.analysis.sla` evaluates it too."""

    itl: list[float] = field(default_factory=list)      # every gap between streamed chunks, seconds
    errors: list[str] = field(default_factory=list)     # one line per failed request

    def summary(self) -> dict:
        s = super().summary()
        for name in ("steps", "mean_batch_size", "slot_utilisation", "preemptions"):
            s.pop(name)                                  # the server's business: read them from its /metrics
        s.update({f"p{q}_itl_s": percentile(self.itl, q) for q in (50, 90, 99)})
        s["mean_itl_s"] = float(np.mean(self.itl)) if self.itl else None
        s["failed"] = len(self.errors)
        return s


def request_body(w: WorkloadRequest, model: str) -> tuple[str, dict]:
    """The endpoint and JSON body for one workload request."""
    p, chat = w.params, isinstance(w.prompt, list) and bool(w.prompt) and isinstance(w.prompt[0], dict)
    body = {"model": model, ("messages" if chat else "prompt"): w.prompt, "max_tokens": p.max_new_tokens,
            "temperature": p.temperature, "stream": True, "stream_options": {"include_usage": True}}
    default = SamplingParams()
    for name in ("top_p", "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "min_tokens", "ignore_eos", "stop_token_ids", "logit_bias", "priority"):   # vLLM's names, sent when set
        value = getattr(p, name)
        if value != getattr(default, name) and not (name == "top_k" and value == -1) and value != {}:
            body[name] = list(value) if isinstance(value, tuple) else (
                {str(t): b for t, b in value.items()} if isinstance(value, dict) else value)
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def chunk_text(chunk: dict) -> str:
    choice = chunk["choices"][0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def carries_tokens(chunk: dict) -> bool:
    """Whether a streamed chunk brings output tokens: every chunk with a choice but a chat's opening
    role chunk. Its text may be empty: a special token (a chat model's <|im_end|> after a plain-text
    prompt), half a multi-byte character, text held back as a possible stop string."""
    delta = chunk["choices"][0].get("delta") or {}
    return bool(chunk_text(chunk)) or "role" not in delta


async def send(client: aiohttp.ClientSession, url: str, index: int, w: WorkloadRequest, model: str, start: float,
               itl: list[float]) -> RequestMetrics | str:
    """Stream one request; its metrics, or a line saying why it failed."""
    path, body = request_body(w, model)
    sent = time.perf_counter()
    times, usage, reason = [], None, None
    try:
        async with client.post(url + path, json=body) as response:
            if response.status != 200:
                return f"request {index}: HTTP {response.status}: {(await response.text())[:200]}"
            async for raw_line in response.content:                    # the stream, line by line
                line = raw_line.decode().rstrip("\r\n")
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    return f"request {index}: {chunk['error'].get('message')}"
                usage = chunk.get("usage") or usage
                if chunk.get("choices"):
                    if carries_tokens(chunk):
                        times.append(time.perf_counter())
                    reason = chunk["choices"][0].get("finish_reason") or reason
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        return f"request {index}: {type(error).__name__}: {error}"
    done = time.perf_counter()
    n = usage["completion_tokens"] if usage else len(times)
    itl.extend(np.diff(times).tolist())
    tpot = (times[-1] - times[0]) / (n - 1) if n > 1 and len(times) > 1 else None
    return RequestMetrics(index, sent - start, None, times[0] - sent if times else None, tpot, done - sent,
                          usage["prompt_tokens"] if usage else 0, n, 0, reason)


async def run_async(url: str, workload: list[WorkloadRequest], model: str | None = None,
                    closed_loop: ClosedLoop | None = None, timeout_s: float = 600.0, use_tqdm: bool = True) -> LoadReport:
    """Replay `workload` against the server at `url`: at its arrival times, or as `closed_loop`'s users."""
    # aiohttp (its HTTP parser in C), as vLLM's benchmark client: on a laptop the client shares the cores
    # with the server, and each cycle it spends per streamed chunk is taken from the engine's steps.
    url = url.rstrip("/")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),        # no cap on connections
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as client:
        if model is None:
            async with client.get(url + "/v1/models", raise_for_status=True) as response:
                model = (await response.json())["data"][0]["id"]
        results: list = [None] * len(workload)
        itl: list[float] = []
        bar = tqdm(total=len(workload), desc="loadtest", unit="req", disable=not use_tqdm)
        start = time.perf_counter()

        async def one(i: int, delay: float = 0.0):
            await asyncio.sleep(delay)
            results[i] = await send(client, url, i, workload[i], model, start, itl)
            bar.update(1)

        if closed_loop is None:
            await asyncio.gather(*(one(i, w.arrival_s) for i, w in enumerate(workload)))
        else:
            queue, rng = list(range(len(workload)))[::-1], np.random.default_rng(closed_loop.seed)

            async def user():
                while queue:
                    await one(queue.pop())
                    if closed_loop.think_s > 0:
                        await asyncio.sleep(rng.exponential(closed_loop.think_s))

            await asyncio.gather(*(user() for _ in range(closed_loop.users)))
        bar.close()
    failed = lambda i: RequestMetrics(i, 0.0, None, None, None, None, 0, 0, 0, "error")  # noqa: E731
    return LoadReport([failed(i) if isinstance(r, str) else r for i, r in enumerate(results)], [], 1,
                      itl=itl, errors=[r for r in results if isinstance(r, str)])


def run(url: str, workload: list[WorkloadRequest], **options) -> LoadReport:
    """`run_async` from synchronous code, including a notebook whose event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_async(url, workload, **options))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:     # a loop runs here (Jupyter): use a fresh one
        return pool.submit(asyncio.run, run_async(url, workload, **options)).result()


def format_summary(summary: dict) -> str:
    return "\n".join(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}" for k, v in summary.items())


def add_arguments(parser) -> None:
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name to send (default: the first in /v1/models)")
    parser.add_argument("--workload", default=None, help="a JSONL trace (minibatch.workloads); else one is drawn")
    parser.add_argument("--num-requests", type=int, default=50, help="requests to draw (default: 50)")
    parser.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (default: all at once)")
    parser.add_argument("--users", type=int, default=None, help="closed loop: this many users instead of arrival times")
    parser.add_argument("--think-s", type=float, default=0.0, help="closed loop: mean think time between requests")
    parser.add_argument("--output-len", type=int, default=32, help="output tokens per request (median with --output-sigma)")
    parser.add_argument("--output-sigma", type=float, default=0.0, help="> 0: log-normal output lengths of this sigma")
    parser.add_argument("--chat", action="store_true", help="send the prompts as chats (/v1/chat/completions)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn workload")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--sla-ttft", type=float, default=SLA.ttft_s, help=f"SLA: TTFT limit in seconds (default: {SLA.ttft_s})")
    parser.add_argument("--sla-tpot", type=float, default=SLA.tpot_s, help=f"SLA: TPOT limit in seconds (default: {SLA.tpot_s})")
    parser.add_argument("--sla-e2e", type=float, default=SLA.e2e_s, help="SLA: e2e latency limit in seconds (default: none)")
    parser.add_argument("--sla-percentile", type=float, default=SLA.percentile,
                        help=f"SLA: share of requests, in %%, within each limit (default: {SLA.percentile:g})")
    parser.add_argument("--json", default=None, help="also write the summary and per-request records to this file")


def main(args) -> int:
    try:
        return _main(args)
    except ConfigError as error:          # a bad flag or trace: say which, no traceback
        print(error, file=sys.stderr)
        return 2


def _main(args) -> int:
    if args.workload:
        workload = load_workload(args.workload)
    else:
        lengths = LogNormal(median=args.output_len, sigma=args.output_sigma) if args.output_sigma > 0 else Fixed(args.output_len)
        arrival = Poisson(rate=args.rate) if args.rate else AllAtOnce()
        workload = make_workload(args.num_requests, arrival, output_len=lengths, as_chat=args.chat,
                                 temperature=args.temperature, seed=args.seed)
    closed = ClosedLoop(args.users, args.think_s, args.seed) if args.users else None
    sla = SLA(args.sla_ttft, args.sla_tpot, args.sla_e2e, args.sla_percentile)
    report = run(args.url, workload, model=args.model, closed_loop=closed, timeout_s=args.timeout)
    summary = evaluate(report, sla)
    print(format_summary(summary))
    print(f"{'SLA':>22}: {sla.describe()}")
    for line in report.errors[:5]:
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "requests": [vars(r) for r in report.requests], "errors": report.errors}, f, indent=1)
    return 1 if report.errors else 0
