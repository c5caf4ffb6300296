"""The engine's own thread, and the thread-safe door the HTTP side talks to it through.

The asyncio event loop handles HTTP; the engine's step loop runs in a thread of its own, so no
request handler ever waits for a step and no step waits for a handler. They meet in two places:
- an inbox (a list under a lock) of commands for the engine thread: add this job, abort that one.
  The thread takes the whole inbox between steps; when it has no work it sleeps on a condition
  variable that `submit` and `abort` notify.
- each job's asyncio queue of `Update`s, filled from the engine thread with
  `loop.call_soon_threadsafe` after every step in which the job's request produced tokens: one call
  per step for all of them, so the event loop wakes once per step, not once per request.
Only the engine thread touches the `LLMEngine`; the HTTP side only reads counts from it.
"""
from __future__ import annotations

import asyncio
import threading
import traceback
from dataclasses import dataclass

from minibatch.config import SamplingParams
from minibatch.engine.arrivals import Arrivals
from minibatch.engine.llm_engine import LLMEngine
from minibatch.engine.threads import adopt_threads
from minibatch.serving.protocol import APIError
from minibatch.serving.responses import TokenLogprob, token_entry
from minibatch.serving.text import TextStream

KEEP_STEP_RECORDS = 10_000       # the engine's per-step records a long-running server keeps


@dataclass
class Update:
    index: int                      # which of the request's n continuations (its choice index)
    text: str                       # new output text since the last update
    num_tokens: int                 # output tokens so far
    finish_reason: str | None = None  # "stop" or "length" on the last update
    error: str | None = None        # set instead when the server ended the request (shutdown)
    logprobs: list[TokenLogprob] | None = None  # the tokens produced since the last update, if asked for
    num_cached_tokens: int = 0      # prompt tokens found in the prefix cache (vLLM's usage.prompt_tokens_details)
    prompt_logprobs: tuple | None = None  # on the first update, if asked: the request's (prompt_logprobs, ranks)


class Job:
    """One continuation of an HTTP request: its handle on its engine request.

    The n continuations of one HTTP request share one queue of updates, told apart by `index`."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, stop: list[str], loop, arrival: float,
                 index: int = 0, updates: asyncio.Queue | None = None):
        self.prompt_ids, self.params, self.loop, self.index = prompt_ids, params, loop, index
        self.arrival = arrival       # engine-clock time the server accepted it: its latencies count from here
        self.text = TextStream(stop)
        self.updates: asyncio.Queue[Update] = updates or asyncio.Queue()
        self.request = None          # the engine's Request, once the engine thread has added it
        self.seen = 0                # output tokens already turned into updates
        self.decoder = None          # the request's OutputDecoder, made with the request
        self.decoded = 0             # output tokens already turned into text
        self.logprobs_sent = 0       # output tokens whose log-probabilities went out

    def push(self, update: Update) -> None:
        """From the engine thread: hand an update to the job's reader on the event loop."""
        self.loop.call_soon_threadsafe(self.updates.put_nowait, update)


def deliver(updates: list[tuple[Job, Update]]) -> None:
    """On the event loop: put each update in its job's queue (a step's updates arrive in one call)."""
    for job, update in updates:
        job.updates.put_nowait(update)


class EngineThread(Arrivals):
    """The engine's step loop in a thread of its own, fed by the HTTP side through an inbox."""

    def __init__(self, engine: LLMEngine, max_waiting: int, on_abort=None):
        self.engine = engine
        self.max_waiting = max_waiting          # queued requests beyond which new ones get 429
        self.on_abort = on_abort or (lambda request: None)  # told of requests ended between steps (monitoring)
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, Job]] = []
        self._active: dict[int, Job] = {}       # engine request id -> job, while it runs
        self._deadline: float | None = None     # engine-clock time after which in-flight requests are errored
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # ---- called from the event loop -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet running: the inbox and the scheduler's queue."""
        return sum(kind == "add" for kind, _ in self._inbox) + self.engine.num_waiting

    def submit(self, jobs: list[Job]) -> None:
        """Queue the continuations of one request, all or none."""
        with self._cond:
            if self._stopping:
                raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
            if self.num_waiting >= self.max_waiting:
                raise APIError(429, f"the queue is full ({self.max_waiting} requests waiting, the server's "
                               "--max-waiting); retry later", "rate_limit_error", code="queue_full",
                               headers={"Retry-After": "1"})
            self._inbox.extend(("add", job) for job in jobs)
            self._cond.notify()

    def abort(self, job: Job) -> None:
        with self._cond:
            self._inbox.append(("abort", job))
            self._cond.notify()

    def stop(self, grace_s: float) -> None:
        """Refuse new requests, let in-flight ones run for grace_s seconds, then error the rest and end."""
        with self._cond:
            self._stopping = True
            self._deadline = self.engine.clock.now() + grace_s
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # ---- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as error:          # a bug in a step: fail every request loudly, never hang them
            traceback.print_exc()
            with self._cond:
                self._stopping = True
                jobs = [job for _, job in self._inbox] + list(self._active.values())
            for job in jobs:
                job.push(Update(job.index, "", job.seen, error=f"the engine failed: {error!r}"))

    def _loop(self) -> None:
        adopt_threads(self.engine.cpu_threads)      # Numba's thread count is per thread: take the engine's
        self.engine.serve(self)             # the engine's arrival loop, with this thread's inbox as the arrivals

    # ---- the engine's Arrivals: the inbox, the shutdown deadline, publishing after each step ----
    def admit(self, engine) -> bool:
        """Sleep while there is nothing to do; then carry out the inbox's commands. More may arrive until stop."""
        with self._cond:
            while not (self._inbox or engine.has_unfinished() or self._stopping):
                self._cond.wait()           # idle: sleep until submit / abort / stop
            commands, self._inbox = self._inbox, []
        for kind, job in commands:
            self._add(job) if kind == "add" else self._abort(job, None)
        if self._deadline is not None and engine.clock.now() >= self._deadline:
            for job in list(self._active.values()):
                self._abort(job, "the server shut down before this request finished")
        return not self._stopping

    def next_event(self) -> float | None:
        return self._deadline

    def wait_until(self, engine, t: float | None) -> None:
        """Work waits for the batching timeout (or the shutdown deadline): sleep until then, or a command."""
        with self._cond:
            if not self._inbox:
                self._cond.wait(max(0.0, t - engine.clock.now()) if t is not None else 0.01)

    def after_step(self, finished: list) -> None:
        self._publish()
        self.engine.forget_old_steps(KEEP_STEP_RECORDS)   # a server runs for days: keep the recent records

    def _add(self, job: Job) -> None:
        job.request = self.engine.add_request(job.prompt_ids, job.params, arrival_time=job.arrival)
        job.decoder = self.engine.prompts.output_decoder()
        self._active[job.request.request_id] = job

    def _abort(self, job: Job, error: str | None) -> None:
        if job.request is None or self._active.pop(job.request.request_id, None) is None:
            return                          # never added, or already over
        self._end_early(job.request, "abort")
        self.engine.release(job.request)
        if error:
            job.push(Update(job.index, "", len(job.request.output_token_ids), error=error))

    def _end_early(self, request, reason: str) -> None:
        """Finish a request between steps: "abort" (client gone, shutdown) or "stop" (a stop string)."""
        self.engine.abort(request, reason)
        self.on_abort(request)

    def _publish(self) -> None:
        """Send every job whose request moved this step its new text, in one call; retire finished ones."""
        updates = []
        for rid, job in list(self._active.items()):
            request = job.request
            n = len(request.output_token_ids)
            if n == job.seen and not request.is_finished:
                continue
            scores = None                   # the prompt's scores, complete once its first token is out
            if job.seen == 0 and request.prompt_logprobs is not None:
                scores = (request.prompt_logprobs, request.prompt_token_ranks)
            job.seen = n
            text_end = n - 1 if request.finish_reason == "stop" else n   # EOS or a stop token: not in the text
            new_text = job.decoder.push(request.output_token_ids[job.decoded:text_end])
            job.decoded = text_end
            if request.is_finished:
                new_text += job.decoder.finish()
            delta, stopped = job.text.update(new_text, request.is_finished)
            if stopped and not request.is_finished:
                self._end_early(request, "stop")   # a stop string: end it now, its blocks go back
            if request.is_finished:
                updates.append((job, Update(job.index, delta, n, "stop" if stopped else request.finish_reason,
                                            logprobs=self._new_logprobs(job),
                                            num_cached_tokens=request.num_cached_tokens, prompt_logprobs=scores)))
                del self._active[rid]
                self.engine.release(request)
            else:       # an update even when the new tokens have no text yet (a special token, half a
                        # character, a held-back stop-string prefix): a chunk per step with tokens, as vLLM streams
                updates.append((job, Update(job.index, delta, n, logprobs=self._new_logprobs(job),
                                            num_cached_tokens=request.num_cached_tokens, prompt_logprobs=scores)))
        if updates:
            updates[0][0].loop.call_soon_threadsafe(deliver, updates)   # every job shares the server's loop

    def _new_logprobs(self, job: Job) -> list[TokenLogprob] | None:
        """The log-probabilities of the tokens produced since the job's last update, with their texts."""
        if job.params.logprobs is None:
            return None
        entries = [token_entry(token, logprobs, job.params.logprobs, self.engine.prompts.decode)
                   for token, logprobs in zip(job.request.output_token_ids[job.logprobs_sent:],
                                              job.request.output_logprobs[job.logprobs_sent:])]
        job.logprobs_sent += len(entries)
        return entries
