"""How many CPU threads an engine runs its products and kernels on: the cores other programs leave free.

A decode step is a few hundred parallel regions (each matrix product, each compiled kernel), and a
parallel region ends only when its slowest thread does. With as many threads as cores, one core
kept busy by another program (a browser tab, a video call, a test suite) makes every region wait
for the thread that shares that core, and the whole step runs many times slower than on the free
cores alone (measurements: docs/performance.md, section "Threads"). So when an engine starts on a
CPU it looks at how many cores other programs kept busy over a fraction of a second, and uses the rest:

    threads = clamp(round(cores - busy cores), 1, the process's default thread count)

The default count is torch's at import (OMP_NUM_THREADS where set, else the cores), so setting
OMP_NUM_THREADS still caps the threads; `EngineConfig(cpu_threads=N)` fixes N and skips the look.
The choice is made again by each new engine and cached for LOOK_TTL_S, so that building many
engines in a row does not pay for many looks. A program that starts after the engine (a load tester,
a second notebook) takes a core too, so while it runs the engine looks again, between steps, at most
every FOLLOW_EVERY_S (`ThreadFollower`: two CPU-time readings, no sleep), and follows a new count once
two looks in a row agree on it. torch's count is process-wide; Numba's is per thread
(a new thread starts at NUMBA_NUM_THREADS), so a thread that drives an engine built in another one,
as the server's engine thread does, calls `adopt_threads` first.
"""
from __future__ import annotations

import os
import threading
import time

import numba
import psutil
import torch

LOOK_S = 0.25       # how long to watch the other programs' load
LOOK_TTL_S = 30.0   # a look is reused for this long
FOLLOW_EVERY_S = 1.0  # a running engine looks again at most this often
DEFAULT_THREADS = torch.get_num_threads()    # before any engine changed it
_last_look: tuple[float, float] | None = None  # (monotonic time, busy cores)


def busy_cores(look_s: float = LOOK_S) -> float:
    """Cores kept busy by programs other than this one, on average over look_s seconds of sleep."""
    me = psutil.Process()
    before, mine_before = psutil.cpu_times(), me.cpu_times()
    start = time.monotonic()
    time.sleep(look_s)
    after, mine_after = psutil.cpu_times(), me.cpu_times()
    elapsed = time.monotonic() - start
    busy_s = _busy_seconds(after) - _busy_seconds(before)                   # every core, every program
    mine_s = (mine_after.user + mine_after.system) - (mine_before.user + mine_before.system)
    return max(0.0, (busy_s - mine_s) / elapsed)


def _busy_seconds(times) -> float:
    """CPU seconds spent on anything but idling since boot, all cores together (Linux counts a virtual
    machine's guest time inside user time, so it is taken out once, as psutil's own cpu_percent does)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0)


def free_threads(cores: int | None = None, busy: float | None = None, most: int | None = None) -> int:
    """Threads for the cores other programs leave free: round(cores - busy), between 1 and most."""
    cores = cores or os.cpu_count() or 1
    most = most or DEFAULT_THREADS
    busy = cached_busy_cores() if busy is None else busy
    return max(1, min(most, round(cores - busy)))


def cached_busy_cores() -> float:
    global _last_look
    now = time.monotonic()
    if _last_look is None or now - _last_look[0] > LOOK_TTL_S:
        _last_look = (now, busy_cores())
    return _last_look[1]


def use_threads(cpu_threads: int | None) -> int:
    """Set torch's and Numba's thread counts for an engine on the CPU: cpu_threads if given, else the free
    cores (free_threads). Returns the count."""
    threads = cpu_threads if cpu_threads is not None else free_threads()
    adopt_threads(threads)                  # first: starting Numba's pool resets OpenMP's
    torch.set_num_threads(threads)
    return threads


def adopt_threads(threads: int) -> None:
    """In a thread about to drive an engine: take the engine's count for Numba too (per thread)."""
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds every program has used since boot, all cores together; those of this process)."""
    mine = psutil.Process().cpu_times()
    return _busy_seconds(psutil.cpu_times()), mine.user + mine.system


class ThreadFollower:
    """An engine's thread count, kept at the cores other programs leave free while the engine runs.

    `follow()` is called between steps. At most every `every_s` it reads the CPU time of every program and
    of this one since its last reading; the difference, over the seconds between, is the cores the others
    kept busy. A count that differs from the engine's is taken once two readings in a row give it, so a
    burst of a fraction of a second does not make the engine switch back and forth."""

    def __init__(self, threads: int, every_s: float = FOLLOW_EVERY_S, clock=time.monotonic, read=cpu_seconds,
                 apply=use_threads):
        self.threads, self.every_s, self.clock, self.read, self.apply = threads, every_s, clock, read, apply
        self.last = (clock(), *read())              # (time, every program's CPU seconds, this one's)
        self.pending = None                         # a new count seen once, waiting for a second look

    def follow(self) -> int:
        """The engine's thread count, changed (torch's and Numba's, in the calling thread) when the others'
        load has changed it for two looks in a row."""
        now = self.clock()
        if now - self.last[0] < self.every_s:
            return self.threads
        busy, mine = self.read()
        others = max(0.0, ((busy - self.last[1]) - (mine - self.last[2])) / (now - self.last[0]))
        self.last = (now, busy, mine)
        wanted = free_threads(busy=others)
        if wanted == self.threads:
            self.pending = None
        elif wanted == self.pending:
            self.threads, self.pending = self.apply(wanted), None
        else:
            self.pending = wanted
        return self.threads


def built_apart(make):
    """make(), run in a thread of its own that then ends; for an engine that another thread will drive.

    Each thread that starts a parallel region gets a team of OpenMP worker threads of its own, kept for
    as long as it lives. Loading a model starts parallel regions (large copies, oneDNN's reorders), so
    an engine built in the main thread and driven from another leaves two teams in the process, four
    threads on two cores; OpenMP then stops spinning between regions and puts its workers to sleep, and
    every region waits for one to wake. Built in a thread that then ends, the engine leaves no second
    team (it ends with its thread), and its decode steps run as fast as one built and driven in the main
    thread (docs/performance.md, section "Threads")."""
    made, failed = [], []

    def build():
        try:
            made.append(make())
        except BaseException as error:      # raised again in the caller's thread
            failed.append(error)

    thread = threading.Thread(target=build, name="build")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]
