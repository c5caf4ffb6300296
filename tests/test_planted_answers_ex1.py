"""Chapters 01-07: each checker rejects the wrong answers learners plant most, with a message that names the rule,
the request or the symptom (asserted on a key phrase), and each exercise stub of these chapters is reported
unsolved; a debugging exercise's stub (the buggy piece) with the symptom its checker points at."""

import ast
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

ROOT = Path(__file__).resolve().parent.parent


def rejected(result_or_call, phrase):
    """A checker's verdict on a wrong answer: an AssertionError, or (debugging exercises) an unsolved result,
    whose message holds `phrase`."""
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


def test_knee_reference_passes():
    assert check_knee_prediction(knee_from_two_steps).solved


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
          floor=False):
    """The right rule, or one of its planted variants."""
    if (running and not busy_joins) or not waiting:
        return []
    if ready and not (len(waiting) >= size or now - waiting[0].arrival_time >= timeout or (busy_joins and running)):
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


def test_admit_reference_passes():
    assert check_admit_static(admit).solved


@pytest.mark.parametrize("options, phrase", [
    ({"busy_joins": True}, "joined while a batch was running"),        # the stub: continuous batching's rule
    ({"ready": False}, "it is not full"),                             # starts whenever someone waits
    ({"skip": True}, "nobody behind it overtakes"),
    ({"floor": True}, "in whole blocks"),
])
def test_admit_mistakes_are_caught(options, phrase):
    rejected(lambda: check_admit_static(lambda *a: admit(*a, **options)), phrase)


def test_admit_that_ignores_the_timeout_is_caught():
    waits_for_full = lambda w, r, now, size, t, free, bs: admit(w, r, now, size, float("inf"), free, bs)  # noqa: E731
    rejected(lambda: check_admit_static(waits_for_full), "nobody was admitted, but a batch is ready")


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


def test_join_leave_reference_passes():
    assert check_join_leave(join_leave).solved


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


def test_timeout_reference_passes():
    assert check_batch_timeout(ready, wake).solved


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


def test_added_ttft_reference_passes():
    assert check_added_ttft(lambda rate, t: (t + rate * t * t / 2) / (1 + rate * t)).solved


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
    from minibatch.engine.schedulers import ScheduledSeq, Scheduler, StepPlan

    class Chunked(Scheduler):
        def schedule(self, now):
            plan, budget = StepPlan(), self.max_tokens_per_step
            for request in self.running:
                tokens = self.tokens_to_compute(request, budget)
                if mistake == "running take all":
                    tokens = request.num_tokens - request.num_computed_tokens
                if tokens == 0:
                    break
                self.blocks.allocate(request.request_id, request.num_computed_tokens + tokens)
                plan.seqs.append(ScheduledSeq(request, tokens))
                budget -= tokens
            while self.waiting and len(self.running) < self.max_batch_size and (budget > 0 or mistake == "no stop"):
                request = self.waiting[0]
                tokens = self.tokens_to_compute(request, budget)
                if mistake == "newcomers take all":
                    tokens = request.num_tokens - request.num_computed_tokens
                if not self.blocks.can_allocate(request.request_id, tokens):
                    break
                self.admit(request)
                self.blocks.allocate(request.request_id, tokens)
                plan.seqs.append(ScheduledSeq(request, tokens))
                budget -= 0 if mistake == "budget kept" else tokens
            return plan

        def finish(self, request):
            super().finish(request)
            self.leave(request)

    return Chunked


def test_budget_scheduler_reference_passes():
    assert check_budget_scheduler(chunked_scheduler()).solved


@pytest.mark.parametrize("mistake, phrase", [
    ("newcomers take all", "more than max_tokens_per_step=16"),          # the stub
    ("running take all", "more than max_tokens_per_step=16"),
    ("budget kept", "more than max_tokens_per_step"),
    ("no stop", "computes 0 tokens"),
])
def test_budget_scheduler_mistakes_are_caught(mistake, phrase):
    rejected(lambda: check_budget_scheduler(chunked_scheduler(mistake)), phrase)


# ---- 06: the KV bytes of a long context, and the batch a budget admits; a growing block table ---------------

def predict_kv(config, size, tokens, budget, block_size):
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * size
    context = -(-tokens // block_size) * block_size * per_token
    return context, budget // context


def test_kv_reference_passes():
    assert check_kv_prediction(predict_kv).solved


@pytest.mark.parametrize("mistake", KV_MISTAKES)
def test_kv_mistakes_are_named(mistake):
    wrong = KV_MISTAKES[mistake][0]
    rejected(lambda: check_kv_prediction(lambda *a: (wrong(*a), predict_kv(*a)[1])), mistake)


def test_kv_batch_without_whole_blocks_is_caught():
    def by_tokens(config, size, tokens, budget, block_size):
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * size
        return predict_kv(config, size, tokens, budget, block_size)[0], budget // (per_token * tokens)
    rejected(lambda: check_kv_prediction(by_tokens), "each sequence needs whole blocks of its own")


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
    assert check_append_token(append).solved
    rejected(lambda: check_append_token(lambda *a: append(*a, **options)), phrase)


# ---- 07: the prefix lookup ----------------------------------------------------------------------------------

def block_hashes(token_ids, block_size):
    from minibatch.engine.kv import hash_block

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


def test_prefix_reference_passes():
    assert check_prefix_hits(block_hashes, cached_tokens).solved


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


# ---- every stub of chapters 01-07 is unsolved; a buggy stub shows its symptom ---------------------------------

BUGGY_STUBS = {("02_static_batching", 2): "joined while a batch was running",
               ("03_continuous_batching", 1): "did not leave",
               ("04_throughput_vs_latency", 1): "from the newest arrival",
               ("05_prefill_vs_decode", 6): "more than max_tokens_per_step",
               ("07_prefix_caching", 2): "hashes each block alone"}
STUBS = [(path.stem, i) for path in sorted((ROOT / "exercises").glob("0[1-7]_*.ipynb"))
         for i, cell in enumerate(json.loads(path.read_text())["cells"])
         if "exercise" in cell.get("metadata", {}).get("tags", [])]


def run_cell(source: str) -> CheckResult:
    """Run an exercise cell in a fresh namespace; its last expression, else its `result`."""
    tree = ast.parse(source)
    last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
    namespace = {"__name__": "__main__"}
    exec(compile(tree, "<stub>", "exec"), namespace)
    return eval(compile(ast.Expression(last.value), "<stub>", "eval"), namespace) if last else namespace["result"]


def test_every_debugging_exercise_is_listed():
    assert set(BUGGY_STUBS) <= set(STUBS)
    marked = {(path.stem, i) for path in sorted((ROOT / "solutions").glob("0[1-7]_*.ipynb"))
              for i, cell in enumerate(json.loads(path.read_text())["cells"])
              if "### BEGIN STUB" in "".join(cell["source"])}
    assert marked == set(BUGGY_STUBS)


@pytest.mark.parametrize("name, index", STUBS, ids=[f"{n}-cell{i}" for n, i in STUBS])
def test_stub_is_reported_unsolved(name, index):
    cell = json.loads((ROOT / "exercises" / f"{name}.ipynb").read_text())["cells"][index]
    result = run_cell("".join(cell["source"]))
    assert isinstance(result, CheckResult) and not result.solved
    assert BUGGY_STUBS.get((name, index), "not solved yet. Replace") in result.message
