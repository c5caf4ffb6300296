"""Chapters 01-07: each checker rejects the wrong answers learners plant most, with a message that names the rule,
the request or the symptom (asserted on a key phrase), and each exercise stub of these chapters is reported
unsolved; a debugging exercise's stub (the buggy piece) with the symptom its checker points at."""

import json
import math
from pathlib import Path

import pytest

from minibatch.checks import (CheckResult, check_added_ttft, check_admit_static, check_append_token,
                              check_batch_timeout, check_budget_scheduler, check_held_slot_steps, check_join_leave,
                              check_knee_prediction, check_kv_prediction, check_prefix_hits)
from minibatch.checks.kv_budget import MISTAKES as KV_MISTAKES
from minibatch.checks.prefix_caching import MISTAKES as PREFIX_MISTAKES
from minibatch.checks.static_batching import HELD_MISTAKES
from minibatch.engine.kv import hash_block
from test_exercises import run_exercise_cell

ROOT = Path(__file__).resolve().parent.parent


def rejected(result_or_call, phrase):
    """The checker's AssertionError, or (a debugging exercise) its unsolved result, names `phrase`."""
    try:
        result = result_or_call()
    except AssertionError as err:
        message = str(err)
    else:
        assert isinstance(result, CheckResult) and not result.solved, f"the wrong answer passed: {result}"
        message = result.message
    assert phrase in message, f"expected {phrase!r} in the message:\n{message}"


# ---- 01: the knee of tok/s against the batch ------------------------------------------------------------------

def knee_of(fixed, per_seq):
    """The first batch from which doubling gains less than 1.5x, for steps of fixed + b * per_seq seconds."""
    b = 1
    while b < 512 and 2 * (fixed + per_seq * b) / (fixed + 2 * per_seq * b) >= 1.5:
        b *= 2
    return b


def knee_from_two_steps(step_1_s, step_8_s):
    per_seq = (step_8_s - step_1_s) / 7
    return knee_of(step_1_s - per_seq, per_seq)


@pytest.mark.parametrize("wrong, phrase", [
    (lambda s1, s8: 1, "too early"),                                                   # a batch costs b steps
    (lambda s1, s8: 512, "too late"),                                                  # batching is free for ever
    (lambda s1, s8: knee_of(s1 - (s8 - s1), s8 - s1), "too early"),                   # s8 - s1 as one sequence
    (lambda s1, s8: knee_of(s1 - s8 / 8, s8 / 8), "too early"),                        # s8 / 8 a sequence
    (lambda s1, s8: 32, "too early"),                                                  # the same batch everywhere
])
def test_knee_mistakes_are_caught(wrong, phrase):
    rejected(lambda: check_knee_prediction(wrong), phrase)


# ---- 02: the static batcher's admission, and the held slot-steps ------------------------------------------------

def admit(waiting, running, now, size, timeout, free, block_size, *, busy_joins=False, ready=True, skip=False,
          floor=False, patient=False, slip=False):
    """The right rule, or one of its planted variants (patient: waits for a full batch, whatever the timeout)."""
    timeout = float("inf") if patient else timeout
    if (running and not busy_joins) or not waiting:
        return []
    waited = now - waiting[0].arrival_time >= timeout if slip else now >= waiting[0].arrival_time + timeout
    if ready and not (len(waiting) >= size or waited or (busy_joins and running)):
        return []
    admitted = []
    for q in waiting[:size]:
        need = q.max_total_tokens // block_size if floor else math.ceil(q.max_total_tokens / block_size)
        if need > free:
            if skip:
                continue
            break
        free -= need
        admitted.append(q.request_id)
    return admitted


@pytest.mark.parametrize("options, phrase", [
    ({"busy_joins": True}, "joined while a batch was running"),        # the stub: continuous batching's rule
    ({"ready": False}, "it is not full"),                             # starts whenever someone waits
    ({"skip": True}, "nobody behind it overtakes"),
    ({"floor": True}, "in whole blocks"),
    ({"patient": True}, "nobody was admitted, but a batch is ready"),
    ({"slip": True}, "the engine would wait for ever"),                # falls just short at the deadline
])
def test_admit_mistakes_are_caught(options, phrase):
    rejected(lambda: check_admit_static(lambda *a: admit(*a, **options)), phrase)


@pytest.mark.parametrize("mistake", HELD_MISTAKES)
def test_held_slot_mistakes_are_named(mistake):
    rejected(lambda: check_held_slot_steps(HELD_MISTAKES[mistake][0]), mistake)


# ---- 03: the join/leave step ----------------------------------------------------------------------------------

def join_leave(running, waiting, size, budget, free, block_size, *, together=False, keep_blocks=False,
               whole=False, skip=False, slots=True):
    """The right step, or one of its planted variants."""
    done = all(r.finished for r in running)
    leaving = [r.request_id for r in running if (done if together else r.finished)]
    staying = [r for r in running if r.request_id not in leaving]
    if not keep_blocks:
        free += sum(r.num_blocks for r in running if r.request_id in leaving)
    for r in staying:
        budget -= min(r.num_pending, budget)
    joining = []
    for w in waiting:
        if (slots and len(staying) + len(joining) >= size) or budget == 0:
            break
        tokens = w.num_prompt_tokens if whole else min(w.num_prompt_tokens, budget)
        need = math.ceil(tokens / block_size)
        if need > free:
            if skip:
                continue
            break
        free, budget = free - need, budget - min(tokens, budget)
        joining.append((w.request_id, tokens))
    return leaving, joining


@pytest.mark.parametrize("options, phrase", [
    ({"together": True}, "did not leave"),                      # the stub: the batch leaves together
    ({"keep_blocks": True}, "the requests that left this step are free for newcomers"),
    ({"whole": True}, "chunked prefill"),
    ({"skip": True}, "nobody behind it overtakes"),
    ({"slots": False}, "max_batch_size="),
])
def test_join_leave_mistakes_are_caught(options, phrase):
    rejected(lambda: check_join_leave(lambda *a: join_leave(*a, **options)), phrase)


# ---- 04: the timeout rule, and the TTFT it adds --------------------------------------------------------------

def ready(arrivals, now, size, timeout):
    return len(arrivals) >= size or now >= arrivals[0] + timeout


def wake(arrivals, timeout):
    return arrivals[0] + timeout if arrivals else None


@pytest.mark.parametrize("batch_ready, wake_time, phrase", [
    (lambda a, now, m, t: len(a) >= m or now - a[-1] >= t,
     lambda a, t: a[-1] + t if a else None, "from the newest arrival"),                # the stub
    (lambda a, now, m, t: len(a) >= m or now - a[0] >= t, wake, "in floating point"),
    (lambda a, now, m, t: len(a) >= m or now > a[0] + t, wake, "it is due now (>=)"),
    (lambda a, now, m, t: len(a) > m or now >= a[0] + t, wake, "fill the batch"),
    (ready, lambda a, t: a[-1] + t if a else None, "past the oldest request's deadline"),
])
def test_timeout_mistakes_are_caught(batch_ready, wake_time, phrase):
    rejected(lambda: check_batch_timeout(batch_ready, wake_time), phrase)


@pytest.mark.parametrize("wrong, phrase", [
    (lambda rate, t: t, "not every request waits the whole timeout"),                    # all wait the full timeout
    (lambda rate, t: t / 2, "the first request of a batch waits the whole timeout"),     # all wait half of it
    (lambda rate, t: 0.0, "the first request of a batch waits the whole timeout"),       # only throughput changes
    (lambda rate, t: rate * t, "the first request of a batch waits the whole timeout"),  # the window's arrivals
])
def test_added_ttft_mistakes_are_caught(wrong, phrase):
    rejected(lambda: check_added_ttft(wrong), phrase)


# ---- 05: the scheduler that ignores the token budget --------------------------------------------------------

def chunked_scheduler(mistake=None):
    """The build exercise's scheduler, or one whose share of the budget is planted wrong."""
    from learner_pieces import JoinLeaveScheduler

    class Chunked(JoinLeaveScheduler):
        def tokens_to_compute(self, request, budget):
            left = request.num_tokens - request.num_computed_tokens
            if (mistake == "newcomers take all" and request in self.waiting
                    or mistake == "running take all" and request in self.running):
                return left
            if mistake == "newcomers see the whole budget" and request in self.waiting:
                return super().tokens_to_compute(request, self.max_tokens_per_step)
            return super().tokens_to_compute(request, budget)

    return Chunked


@pytest.mark.parametrize("mistake, phrase", [
    ("newcomers take all", "more than max_tokens_per_step=16"),          # the stub
    ("running take all", "more than max_tokens_per_step=16"),
    ("newcomers see the whole budget", "more than max_tokens_per_step"),
])
def test_budget_scheduler_mistakes_are_caught(mistake, phrase):
    rejected(lambda: check_budget_scheduler(chunked_scheduler(mistake)), phrase)


# ---- 06: the KV bytes of a long context, and the batch a budget admits; a growing block table ---------------

def predict_kv(config, size, tokens, budget, block_size, *, by_tokens=False):
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * size
    context = -(-tokens // block_size) * block_size * per_token
    return context, budget // (per_token * tokens if by_tokens else context)


@pytest.mark.parametrize("mistake", KV_MISTAKES)
def test_kv_mistakes_are_named(mistake):
    wrong = KV_MISTAKES[mistake][0]
    rejected(lambda: check_kv_prediction(lambda *a: (wrong(*a), predict_kv(*a)[1])), mistake)


def test_kv_batch_without_whole_blocks_is_caught():
    rejected(lambda: check_kv_prediction(lambda *a: predict_kv(*a, by_tokens=True)), "needs whole blocks of its own")


def append(table, num_tokens, free, block_size, *, back=False, every=False, offset=True):
    if every or num_tokens % block_size == 0:
        table.append(free.pop() if back else free.popleft())
    position = num_tokens % block_size if offset else num_tokens
    return table[num_tokens // block_size] * block_size + position


@pytest.mark.parametrize("options, phrase", [
    ({"back": True}, "take blocks from the front"),
    ({"every": True}, "still fits in the last block"),
    ({"offset": False}, "plus its offset in the block"),
])
def test_append_token_mistakes_are_caught(options, phrase):
    rejected(lambda: check_append_token(lambda *a: append(*a, **options)), phrase)


# ---- 07: the prefix lookup ----------------------------------------------------------------------------------

def block_hashes(token_ids, block_size):
    hashes, parent = [], b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


def cached_tokens(token_ids, block_size, cached, *, last=False, blocks=False, all_blocks=False):
    found = 0
    for h in block_hashes(token_ids if last else token_ids[:-1], block_size):
        if h not in cached and not all_blocks:
            break
        found += 1 if blocks else block_size
    return found


@pytest.mark.parametrize("mistake", PREFIX_MISTAKES)
def test_prefix_hash_mistakes_are_named(mistake):
    rejected(lambda: check_prefix_hits(PREFIX_MISTAKES[mistake], cached_tokens), mistake)


@pytest.mark.parametrize("options, phrase", [
    ({"last": True}, "must still compute its last token"),        # the stub's second bug
    ({"blocks": True}, "that is the number of blocks found"),
    ({"all_blocks": True}, "reuse stops at the first block"),
])
def test_prefix_lookup_mistakes_are_caught(options, phrase):
    rejected(lambda: check_prefix_hits(block_hashes, lambda *a: cached_tokens(*a, **options)), phrase)


# ---- the references pass; every stub is unsolved, a buggy one with its symptom --------------------------------

BUGGY_STUBS = {("02_static_batching", 2): "joined while a batch was running",
               ("03_continuous_batching", 1): "did not leave",
               ("04_throughput_vs_latency", 1): "from the newest arrival",
               ("05_prefill_vs_decode", 6): "more than max_tokens_per_step",
               ("07_prefix_caching", 2): "hashes each block alone"}
STUBS = [(path.stem, i) for path in sorted((ROOT / "exercises").glob("0[1-7]_*.ipynb"))
         for i, cell in enumerate(json.loads(path.read_text())["cells"])
         if "exercise" in cell.get("metadata", {}).get("tags", [])]


@pytest.mark.parametrize("check, answer", [
    (check_knee_prediction, (knee_from_two_steps,)), (check_admit_static, (admit,)), (check_join_leave, (join_leave,)),
    (check_batch_timeout, (ready, wake)),
    (check_added_ttft, (lambda rate, t: (t + rate * t * t / 2) / (1 + rate * t),)),
    (check_budget_scheduler, (chunked_scheduler(),)), (check_kv_prediction, (predict_kv,)),
    (check_append_token, (append,)), (check_prefix_hits, (block_hashes, cached_tokens)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_reference_passes(check, answer):
    assert check(*answer).solved


def test_every_debugging_exercise_is_listed():
    assert set(BUGGY_STUBS) <= set(STUBS)
    marked = {(path.stem, i) for path in sorted((ROOT / "solutions").glob("0[1-7]_*.ipynb"))
              for i, cell in enumerate(json.loads(path.read_text())["cells"])
              if "### BEGIN STUB" in "".join(cell["source"])}
    assert marked == set(BUGGY_STUBS)


@pytest.mark.parametrize("name, index", STUBS, ids=[f"{n}-cell{i}" for n, i in STUBS])
def test_stub_is_reported_unsolved(name, index):
    cell = json.loads((ROOT / "exercises" / f"{name}.ipynb").read_text())["cells"][index]
    result = run_exercise_cell("".join(cell["source"]), f"exercises/{name}.ipynb, cell {index}")
    assert isinstance(result, CheckResult) and not result.solved
    assert BUGGY_STUBS.get((name, index), "not solved yet. Replace") in result.message
