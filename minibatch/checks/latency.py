"""Chapter 04 (throughput versus latency): the batching-timeout rule."""

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


def _engine_timeout_rule(arrivals, now, max_batch_size, batch_timeout_s):
    """(batch_ready(now), wake_time()) of the engine's own Scheduler with requests waiting since `arrivals`."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.engine.kv import BlockManager
    from minibatch.engine.request import Request
    from minibatch.engine.schedulers import Scheduler

    config = EngineConfig(model="tiny", max_batch_size=max_batch_size, batch_timeout_s=batch_timeout_s)
    scheduler = Scheduler(config, BlockManager(1, 16))
    for i, t in enumerate(arrivals):
        scheduler.add(Request(i, [1], SamplingParams(), t))
    return (scheduler.batch_ready(now) if arrivals else None), scheduler.wake_time()


def _timeout_situations() -> list[tuple]:
    """(arrivals, now, max_batch_size, batch_timeout_s): one per rule, then random ones."""
    situations = [([0.0, 0.1, 0.2], 0.2, 3, 1.0),         # a full batch waits: start now
                  ([0.0, 0.1, 0.2, 0.3], 0.3, 2, 5.0),    # more than a full batch
                  ([0.0, 0.5], 0.7, 4, 1.0),              # not full, the oldest has waited 0.7 s of 1 s
                  ([0.0, 0.5], 1.0, 4, 1.0),              # the oldest has waited exactly the timeout
                  ([2.0, 2.5], 2.9, 8, 1.0),              # the clock is not at zero
                  ([0.3], 0.3, 8, 0.0),                   # timeout 0: start at once
                  ([0.7], 0.7 + 0.1, 8, 0.1)]             # the deadline itself, as a float: 0.7 + 0.1
    rng = np.random.default_rng(4)
    for _ in range(30):
        arrivals = np.sort(rng.uniform(0, 3, int(rng.integers(1, 7)))).round(2).tolist()
        timeout = float(rng.choice([0.0, 0.05, 0.1, 0.3, 0.7, 1.0]))
        now = arrivals[0] + timeout if rng.random() < 0.4 else round(arrivals[-1] + float(rng.uniform(0, 1.2)), 2)
        situations.append((arrivals, max(now, arrivals[-1]), int(rng.integers(1, 6)), timeout))
    return situations


def _serve_with_rule(scheduler: str, batch_ready=None, wake_time=None) -> list[tuple]:
    """(first token time, finish time) per request of a simulated run of `tiny`, with the engine's
    timeout rule, or with the given functions in its place."""
    from minibatch.config import EngineConfig
    from minibatch.workloads.distributions import Poisson, Uniform
    from minibatch.llm import LLM
    from minibatch.workloads import make_workload

    llm = LLM(EngineConfig(model="tiny", scheduler=scheduler, clock="simulated", sim_skip_model=True,
                           max_batch_size=4, batch_timeout_s=0.3))
    engine, sched = llm.engine, llm.engine.scheduler
    if batch_ready is not None:
        arrivals = lambda: [r.arrival_time for r in sched.waiting]
        sched.batch_ready = lambda now: batch_ready(arrivals(), now, sched.max_batch_size, sched.batch_timeout_s)
        sched.wake_time = lambda: wake_time(arrivals(), sched.batch_timeout_s)
        sleep, naps = engine.clock.sleep_until, []

        def guarded_sleep(t):           # an idle engine whose rule never fires would wait forever
            naps.append(t)
            assert len(naps) < 5000, (f"with your functions the idle engine never starts its batch: it woke at "
                                      f"{t!r} and found batch_ready False again and again")
            sleep(t)
        engine.clock.sleep_until = guarded_sleep
    llm.run(make_workload(30, arrival=Poisson(3.0), output_len=Uniform(2, 10), seed=4), use_tqdm=False)
    return [(r.first_token_time, r.finish_time) for r in engine.requests.values()]


@checker("batch_ready(arrivals, now, max_batch_size, batch_timeout_s) and wake_time(arrivals, batch_timeout_s)")
def check_batch_timeout(batch_ready, wake_time):
    situations = _timeout_situations()
    count = check_cases(batch_ready, [Case(s, _engine_timeout_rule(*s)[0]) for s in situations])
    wakes = [([], 0.5)] + [(s[0], s[3]) for s in situations[::3]]
    count += check_cases(wake_time, [Case(w, _engine_timeout_rule(w[0], 0.0, 1, w[1])[1]) for w in wakes])
    for scheduler in ("static", "continuous"):
        expected, got = _serve_with_rule(scheduler), _serve_with_rule(scheduler, batch_ready, wake_time)
        wrong = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
        assert not wrong, (f"serving a workload with scheduler={scheduler!r}, max_batch_size=4, batch_timeout_s=0.3 "
                           f"and your rule, request {wrong[0]} got (first token, finish) at {got[wrong[0]]}; "
                           f"the engine's rule gives {expected[wrong[0]]}")
        count += 1
    return count
