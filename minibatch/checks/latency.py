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


# The usual wrong turns of batch_ready, each with the symptom it shows.
READY_MISTAKES = {
    "measures the wait from the newest arrival": (
        lambda a, now, m, t: len(a) >= m or now >= a[-1] + t,
        "the timeout bounds how long the OLDEST waiting request waits (arrivals[0]); measured from the newest, "
        "every newcomer restarts the clock, and under a steady trickle of arrivals the batch never starts"),
    "subtracts before comparing": (
        lambda a, now, m, t: len(a) >= m or now - a[0] >= t,
        "in floating point (a + t) - a can come out a hair below t (try 0.7 + 0.1 - 0.7 >= 0.1): an engine that "
        "wakes at wake_time() finds the batch not ready and sleeps until the same moment again. Compare now "
        "with the deadline computed exactly as wake_time computes it"),
    "measures the wait from the newest arrival, as now - arrivals[-1]": (
        lambda a, now, m, t: len(a) >= m or now - a[-1] >= t,
        "the timeout bounds how long the OLDEST waiting request waits (arrivals[0]); measured from the newest, "
        "every newcomer restarts the clock, and under a steady trickle of arrivals the batch never starts"),
    "waits strictly longer than the timeout": (
        lambda a, now, m, t: len(a) >= m or now > a[0] + t,
        "the oldest request has waited exactly the timeout: it is due now (>=), and an engine woken at the "
        "deadline must find it ready"),
    "waits for more than a full batch": (
        lambda a, now, m, t: len(a) > m or now >= a[0] + t,
        "max_batch_size requests waiting fill the batch: start it (>=), the timeout only matters for a batch "
        "that is not full"),
}


@checker("batch_ready(arrivals, now, max_batch_size, batch_timeout_s) and wake_time(arrivals, batch_timeout_s)",
         debug=True)
def check_batch_timeout(batch_ready, wake_time):
    """Debugging exercise: the learner's timeout rule against the engine's Scheduler, then serving with it."""
    situations = _timeout_situations()
    answers = [(s, batch_ready(*s), _engine_timeout_rule(*s)[0]) for s in situations]
    wrong_at = next(((s, got) for s, got, want in answers if got != want), None)
    for mistake, (wrong, advice) in READY_MISTAKES.items():    # the mistake that explains every answer
        if wrong_at and all(got == wrong(*s) for s, got, _ in answers):
            raise AssertionError(f"batch_ready{wrong_at[0]} returned {wrong_at[1]}: your rule {mistake}: {advice}")
    count = check_cases(batch_ready, [Case(s, _engine_timeout_rule(*s)[0]) for s in situations])
    wakes = [([], 0.5)] + [(s[0], s[3]) for s in situations[::3]]
    for arrivals, timeout in wakes:
        got = wake_time(arrivals, timeout)
        if len(arrivals) > 1 and got == arrivals[-1] + timeout != arrivals[0] + timeout:
            raise AssertionError(f"wake_time({arrivals}, {timeout}) returned {got}: the idle engine would sleep past "
                                 f"the oldest request's deadline, {arrivals[0] + timeout}; wake it when the oldest "
                                 "request has waited the timeout")
    count += check_cases(wake_time, [Case(w, _engine_timeout_rule(w[0], 0.0, 1, w[1])[1]) for w in wakes])
    for scheduler in ("static", "continuous"):
        expected, got = _serve_with_rule(scheduler), _serve_with_rule(scheduler, batch_ready, wake_time)
        wrong = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
        assert not wrong, (f"serving a workload with scheduler={scheduler!r}, max_batch_size=4, batch_timeout_s=0.3 "
                           f"and your rule, request {wrong[0]} got (first token, finish) at {got[wrong[0]]}; "
                           f"the engine's rule gives {expected[wrong[0]]}")
        count += 1
    return count


# ---- predict, then measure: the TTFT a batching timeout adds at a given load ------------------------------------

TTFT_LOADS = [(0.2, 1.0), (1.0, 2.0), (0.5, 4.0), (4.0, 0.5)]     # (requests per second, batch_timeout_s)
TTFT_TOLERANCE = 0.15                                               # of the timeout


def measured_added_ttft(rate, timeout, num_requests=200, seed=0):
    """Mean TTFT with the timeout minus without it, on the simulated clock (the profile in use): Poisson arrivals,
    4-token prompts that each want one token, continuous batching with 8 slots."""
    from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest

    times = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, num_requests))
    workload = [WorkloadRequest(float(t), [5, 6, 7, 8], SamplingParams(max_new_tokens=1, ignore_eos=True))
                for t in times]
    mean_ttft = []
    for batch_timeout_s in (0.0, timeout):
        llm = LLM(EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True, max_batch_size=8,
                               batch_timeout_s=batch_timeout_s))
        mean_ttft.append(float(np.mean([r.ttft for r in llm.run(workload, use_tqdm=False).requests])))
    return mean_ttft[1] - mean_ttft[0], llm.config.sim_profile


@checker("predict_added_ttft(rate, batch_timeout_s): the mean TTFT a batching timeout adds")
def check_added_ttft(predict_added_ttft):
    """Scores predictions against the simulated clock, within TTFT_TOLERANCE of the timeout."""
    rows = []
    for rate, timeout in TTFT_LOADS:
        predicted = predict_added_ttft(rate, timeout)
        assert isinstance(predicted, (int, float)), f"predict_added_ttft must return seconds, got {predicted!r}"
        measured, profile = measured_added_ttft(rate, timeout)
        rows.append((rate, timeout, predicted, measured))
        if abs(predicted - measured) > TTFT_TOLERANCE * timeout:
            side = "more" if predicted > measured else "less"
            raise AssertionError(
                f"at {rate:g} requests/s with batch_timeout_s={timeout:g} you predicted {predicted:.2f} s, but the "
                f"timeout adds {measured:.2f} s to the mean TTFT on the simulated clock (profile {profile!r}); the "
                f"tolerance is {TTFT_TOLERANCE:.0%} of the timeout, {TTFT_TOLERANCE * timeout:.2f} s. You predicted "
                f"{side} than it adds: " + ("not every request waits the whole timeout, only the one that finds the "
                                            "engine idle and empty; who arrives during its wait boards the same batch"
                                            if side == "more" else
                                            "at a low load most requests find the engine idle and empty, and the "
                                            "first request of a batch waits the whole timeout, whoever else comes"))
    print(" rate/s  timeout (s)  predicted (s)  measured (s, simulated)")
    for rate, timeout, predicted, measured in rows:
        print(f"{rate:7g} {timeout:12g} {predicted:14.2f} {measured:24.2f}")
    print("Each prediction is within 15% of its timeout of what the simulated clock measured. The request that finds "
          "the engine idle and empty opens a window of batch_timeout_s and waits all of it; each request that arrives "
          "within the window boards the same batch and waits only what is left of it, half the window on average. A "
          "window collects 1 + rate x timeout requests on average, so at a low load the timeout adds almost all of "
          "itself and at a higher load less. The simulated steps add a little: a request that arrives while a batch is "
          "computing waits for that step, timeout or not.")
    return len(rows)
