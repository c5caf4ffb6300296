"""The conversation between the benchmark and a peer running in its own Python: JSON, one object per line.

The benchmark starts `<peer python> <runner script>` and writes to its standard input:

    {"model": ..., "max_len": 160, ...}                            the spec: what to load, once
    {"prompts": [[1, 2, ...], ...], "output_lens": [64, ...],      a job: serve these, greedy, ignoring EOS,
     "batch_size": 8}                                              at most batch_size at a time
    ...                                                            (more jobs; end of input ends the runner)

and reads from its standard output one line per line it wrote:

    {"ready": true, "load_s": 12.3, "version": "0.32.0", ...}      after loading (with what the runner reports)
    {"outputs": [[tokens of request 0], ...], "seconds": 4.56}     after each job: tokens in job order and the
                                                                   wall time from handing over to the last token
    {"error": "the traceback"}                                     instead of either, when something failed

The peers write logs to standard output too, so the runner keeps a private copy of it for its answers and
points the original at standard error before the peer is imported. Standard library only: this file is run
by the peers' Pythons, which hold none of the course's packages.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback


def open_channel():
    """The file the answers go to: a copy of standard output, after which anything else printed to standard
    output (by Python or by a C library) lands on standard error."""
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def send(channel, message: dict) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(load, generate) -> int:
    """Run the conversation. load(spec) -> (state, info dict); generate(state, prompts, output_lens, batch_size)
    -> the tokens of each request."""
    channel = open_channel()
    try:
        start = time.perf_counter()
        state, info = load(json.loads(sys.stdin.readline()))
        send(channel, {"ready": True, "load_s": time.perf_counter() - start, **info})
    except Exception:
        send(channel, {"error": traceback.format_exc()})
        return 1
    for line in sys.stdin:
        try:
            job = json.loads(line)
            start = time.perf_counter()
            outputs = generate(state, job["prompts"], job["output_lens"], job.get("batch_size", 1))
            seconds = time.perf_counter() - start
            send(channel, {"outputs": [[int(t) for t in tokens] for tokens in outputs], "seconds": seconds})
        except Exception:
            send(channel, {"error": traceback.format_exc()})
    return 0
