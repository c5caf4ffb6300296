"""An engine on the CPU uses the cores other programs leave free (minibatch/engine/threads.py)."""
import subprocess
import sys
import time
from collections import namedtuple
from types import SimpleNamespace

import numba
import pytest
import torch

from minibatch import LLM, EngineConfig
from minibatch.config import ConfigError
from minibatch.engine import threads


@pytest.fixture
def restore_threads():
    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    yield
    numba.set_num_threads(numba_before)        # Numba first: starting its pool resets OpenMP's count
    torch.set_num_threads(torch_before)


@pytest.mark.parametrize("cores,busy,most,expected", [
    (2, 0.0, 2, 2), (2, 0.3, 2, 2), (2, 1.0, 2, 1), (2, 2.7, 2, 1),    # one core busy: one thread
    (8, 2.6, 8, 5), (8, 0.0, 4, 4), (16, 15.9, 16, 1), (1, 0.0, 1, 1),
])
def test_threads_are_the_free_cores_between_one_and_the_default(cores, busy, most, expected):
    assert threads.free_threads(cores, busy, most) == expected


def test_a_program_spinning_on_a_core_counts_as_busy():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)                                                     # let it start spinning
        busy = max(threads.busy_cores(0.3) for _ in range(2))
    finally:
        spinner.kill()
        spinner.wait()
    assert busy >= 0.5, busy


def test_this_process_own_work_is_not_counted(monkeypatch):
    """Counters as the OS reports them: 1.5 s of busy CPU over a 1 s look, of which this process spent 1.0 s."""
    Times = namedtuple("Times", "user nice system idle iowait guest guest_nice")
    Mine = namedtuple("Mine", "user system")
    machine = iter([Times(100.0, 0, 50.0, 900.0, 5.0, 3.0, 0), Times(101.2, 0, 50.3, 900.5, 5.0, 3.1, 0)])
    mine = iter([Mine(10.0, 1.0), Mine(10.8, 1.2)])
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(threads.psutil, "cpu_times", lambda: next(machine))
    monkeypatch.setattr(threads.psutil, "Process", lambda: SimpleNamespace(cpu_times=lambda: next(mine)))
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    # busy: user 1.2 + system 0.3 = 1.5 s (the 0.1 s of guest time is inside user, so not counted twice); mine 1.0 s
    assert threads.busy_cores() == pytest.approx(0.5)


def test_a_fixed_count_sets_torch_and_numba_and_skips_the_look(restore_threads, monkeypatch):
    monkeypatch.setattr(threads, "busy_cores", lambda *a: pytest.fail("no look with a fixed count"))
    assert threads.use_threads(1) == 1
    assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1


def test_the_engine_reports_and_uses_its_threads(restore_threads, monkeypatch):
    llm = LLM(EngineConfig(model="tiny", cpu_threads=1))
    assert llm.engine.cpu_threads == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "_last_look", None)
    monkeypatch.setattr(threads, "busy_cores", lambda *a: float(threads.os.cpu_count() or 1))   # every core busy
    assert LLM(EngineConfig(model="tiny")).engine.cpu_threads == 1


def test_a_look_is_reused_for_a_while(monkeypatch):
    looks = []
    monkeypatch.setattr(threads, "_last_look", None)
    monkeypatch.setattr(threads, "busy_cores", lambda *a: looks.append(1) or 0.0)
    threads.free_threads(), threads.free_threads()
    assert len(looks) == 1


@pytest.mark.parametrize("value", [0, -2, 1.5, "2"])
def test_a_bad_thread_count_names_the_field(value):
    with pytest.raises(ConfigError, match=f"cpu_threads={value!r}"):
        EngineConfig(model="tiny", cpu_threads=value)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs Numba's default above one thread")
def test_the_servers_engine_thread_keeps_the_engines_count(restore_threads):
    """Numba counts threads per thread: the server's engine thread takes the engine's count, not Numba's default."""
    import httpx
    from minibatch.serving.server import ServerThread
    counts = []
    with ServerThread(EngineConfig(model="tiny", cpu_threads=1)) as server:
        server.engine.step_observers.append(lambda record, finished: counts.append(numba.get_num_threads()))
        reply = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": "Hi", "max_tokens": 3})
    assert reply.status_code == 200 and counts and set(counts) == {1}


def test_built_apart_makes_in_a_thread_that_has_ended_and_raises_its_errors():
    import threading
    seen = []

    def make():
        seen.append(threading.current_thread())
        return "engine"

    assert threads.built_apart(make) == "engine"
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    with pytest.raises(ConfigError, match="nope"):
        threads.built_apart(lambda: (_ for _ in ()).throw(ConfigError("nope")))


def test_the_server_builds_its_engine_apart_from_the_thread_that_serves(monkeypatch):
    """The server's engine is built in a thread that ends (no OpenMP team of the builder's left beside the engine
    thread's); a bad config still fails in the caller, with its message."""
    from minibatch.serving import server as server_module
    calls = []
    real = server_module.built_apart
    monkeypatch.setattr(server_module, "built_apart", lambda make: calls.append(make) or real(make))
    app = server_module.build_server(EngineConfig(model="tiny"))
    assert len(calls) == 1 and app.state.server.engine is not None
    with pytest.raises(ConfigError, match="quantization"):
        server_module.build_server(EngineConfig(model="tiny", quantization="q4_1"))


def test_a_running_engine_follows_the_cores_another_program_takes_after_it_started(monkeypatch):
    """Two looks in a row that agree change the count; one look alone (a burst) does not; between looks
    closer than every_s nothing is read."""
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "DEFAULT_THREADS", 2)
    now, busy, mine, applied = [0.0], [0.0], [0.0], []
    follower = threads.ThreadFollower(2, every_s=1.0, clock=lambda: now[0], read=lambda: (busy[0], mine[0]),
                                      apply=lambda n: applied.append(n) or n)

    def second(others: float, engine: float = 2.0) -> int:     # one second: the others' and the engine's CPU
        now[0] += 1.0
        busy[0] += others + engine
        mine[0] += engine
        return follower.follow()

    assert second(0.0) == 2 and second(1.0) == 2                 # a core taken: seen once, not yet followed
    assert second(1.0) == 1 and applied == [1]                   # seen twice: one thread
    assert second(0.0, 1.0) == 1 and second(1.0, 1.0) == 1       # a one-look dip is not followed
    assert second(0.0, 1.0) == 1 and second(0.0, 1.0) == 2 and applied == [1, 2]   # the core is back
    reads = []
    follower.read = lambda: reads.append(1) or (busy[0], mine[0])
    now[0] += 0.5
    assert follower.follow() == 2 and not reads                  # too soon after the last look: nothing read


def test_a_fixed_thread_count_is_not_followed():
    assert LLM(EngineConfig(model="tiny", cpu_threads=1)).engine.threads is None
    assert LLM(EngineConfig(model="tiny")).engine.threads is not None


def test_an_engine_looks_between_its_steps_when_it_serves_and_generates():
    llm = LLM(EngineConfig(model="tiny"))
    looks = []
    llm.engine.threads.follow = lambda: looks.append(1) or llm.engine.cpu_threads
    from minibatch import SamplingParams, WorkloadRequest
    llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3), use_tqdm=False)
    generated = len(looks)
    llm.run([WorkloadRequest(0.0, [4, 5, 6], SamplingParams(max_new_tokens=3))], use_tqdm=False)
    assert generated >= 3 and len(looks) >= generated + 3           # once before every step of both loops
