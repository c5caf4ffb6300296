"""Chapter 03 (continuous batching): which requests join and leave in one step."""

from dataclasses import dataclass

import numpy as np

from minibatch.checks.core import Case, check_cases, checker, describe_call, same_value


@dataclass(frozen=True)
class Running:
    """A request holding a slot at the end of the last step."""

    request_id: int
    finished: bool           # it produced its last token in the last step
    num_pending: int         # tokens it computes next (1 for a decode, more for a prompt not yet prefilled)
    num_blocks: int          # KV blocks it holds (already room for its pending tokens)


@dataclass(frozen=True)
class Waiting:
    """A request in the queue, nothing of it computed yet."""

    request_id: int
    num_prompt_tokens: int


def _continuous_engine_step(running, waiting, max_batch_size, token_budget, free_blocks, block_size):
    """(leaving ids, [(joining id, tokens it computes)]) by the engine's own ContinuousScheduler."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.engine.kv import BlockManager
    from minibatch.engine.request import Request
    from minibatch.engine.schedulers import ContinuousScheduler

    config = EngineConfig(model="tiny", max_batch_size=max_batch_size, max_tokens_per_step=token_budget,
                          block_size=block_size)
    blocks = BlockManager(free_blocks + sum(r.num_blocks for r in running), block_size)
    scheduler = ContinuousScheduler(config, blocks)
    members = []
    for r in running:  # each holds num_blocks blocks and has num_pending tokens left to compute
        prompt = r.num_blocks * block_size
        request = Request(r.request_id, [1] * prompt, SamplingParams(max_new_tokens=8), 0.0)
        request.num_computed_tokens = prompt - r.num_pending
        scheduler._admit(request)
        blocks.allocate(r.request_id, prompt)
        members.append((r, request))
    for w in waiting:
        scheduler.add(Request(w.request_id, [1] * w.num_prompt_tokens, SamplingParams(max_new_tokens=8), 0.0))
    for r, request in members:
        if r.finished:
            request.finish("length", 0.0)
            scheduler.finish(request)
    plan = scheduler.schedule(0.0)
    assert not plan.preempted, "checker set-up error: running requests hold all the blocks they need"
    joined = [(s.request.request_id, s.num_new_tokens) for s in plan.seqs
              if s.request.request_id in {w.request_id for w in waiting}]
    return [r.request_id for r in running if r.finished], joined


def _continuous_cases() -> list[Case]:
    """Hand-picked situations (one per rule), then random ones; answers from the engine."""
    situations = [  # running, waiting, max_batch_size, token_budget, free_blocks, block_size
        ([Running(0, False, 1, 2), Running(1, True, 1, 2)], [Waiting(2, 20), Waiting(3, 20)], 2, 512, 10, 16),
        ([Running(0, True, 1, 2), Running(1, True, 1, 2)], [Waiting(2, 20), Waiting(3, 20), Waiting(4, 5)],
         2, 512, 0, 16),                                            # leavers' blocks go to the joiners
        ([Running(0, False, 1, 2)], [Waiting(1, 100), Waiting(2, 100)], 4, 128, 20, 16),  # budget: a chunk
        ([Running(0, False, 1, 2)], [Waiting(1, 40)], 4, 512, 2, 16),  # 40 tokens need 3 blocks: wait
        ([Running(0, False, 60, 4)], [Waiting(1, 10)], 4, 60, 20, 16),  # a running prefill takes the budget
        ([], [Waiting(0, 10), Waiting(1, 10), Waiting(2, 10)], 2, 512, 50, 16),  # an empty batch fills up
        ([Running(0, False, 1, 1)], [], 4, 512, 5, 16),             # nobody waiting
    ]
    from dataclasses import replace

    rng = np.random.default_rng(3)
    for _ in range(30):
        block_size = int(rng.choice([4, 8, 16]))
        n_run = int(rng.integers(0, 6))
        running = [Running(i, bool(rng.random() < 0.4), 1 if rng.random() < 0.8 else int(rng.integers(2, 40)),
                           int(rng.integers(1, 6))) for i in range(n_run)]
        running = [replace(r, num_blocks=max(r.num_blocks, -(-r.num_pending // block_size))) for r in running]
        waiting = [Waiting(n_run + i, int(rng.integers(1, 150))) for i in range(int(rng.integers(0, 6)))]
        situations.append((running, waiting, int(rng.integers(max(1, n_run), 8)), int(rng.choice([16, 64, 256, 512])),
                           int(rng.integers(0, 30)), block_size))
    return [Case(s, _continuous_engine_step(*s)) for s in situations]


def _join_leave_symptom(case: Case, got) -> str | None:
    """What the engine would show with this wrong answer: which rule, which request."""
    running, waiting, max_batch_size, token_budget, free_blocks, block_size = case.args
    _, join_want = case.expected
    try:
        leave_got, join_got = list(got[0]), [tuple(j) for j in got[1]]
    except (TypeError, IndexError, ValueError):
        return None
    stuck = [r.request_id for r in running if r.finished and r.request_id not in leave_got]
    if stuck:
        return (f"request {stuck[0]} finished in the last step but did not leave: it holds its slot (and its KV "
                "blocks) until the whole batch ends, the grey 'held' cells of static batching's slot timeline. In "
                "continuous batching a finished request leaves at once and a waiting one takes its slot")
    if len([r for r in running if not r.finished]) + len(join_got) > max_batch_size:
        return f"{len(join_got)} requests joined, but only the slots left by max_batch_size={max_batch_size} are free"
    budget_left = token_budget - sum(min(r.num_pending, token_budget) for r in running if not r.finished)
    if sum(t for _, t in join_got) > max(budget_left, 0):
        return (f"the joiners compute {sum(t for _, t in join_got)} tokens, but only {max(budget_left, 0)} of the "
                f"step's token budget of {token_budget} were left after the running requests: a newcomer computes "
                "what fits and the rest of its prompt goes in later steps (chunked prefill)")
    ids = [w.request_id for w in waiting]
    order = [ids.index(i) for i, _ in join_got if i in ids]
    if order != list(range(len(order))):
        return (f"requests {[i for i, _ in join_got]} joined from the queue {ids}: admission stops at the first "
                "request whose blocks do not fit; nobody behind it overtakes")
    if len(join_got) < len(join_want) and join_got == join_want[:len(join_got)]:
        freed = sum(r.num_blocks for r in running if r.finished)
        nxt = join_want[len(join_got)][0]
        return (f"request {nxt} did not join, but there was room for it: the slots and the {freed} KV blocks of the "
                f"requests that left this step are free for newcomers in the same step ({free_blocks} were free "
                "before)")
    return None


@checker("join_leave(running, waiting, max_batch_size, token_budget, free_blocks, block_size)", debug=True)
def check_join_leave(join_leave):
    """Debugging exercise: the learner's join/leave step against the engine's ContinuousScheduler, with the symptom."""
    cases = _continuous_cases()
    for case in cases:
        got = join_leave(*case.args)
        if not same_value(got, case.expected):
            symptom = _join_leave_symptom(case, got)
            if symptom:
                raise AssertionError(f"{describe_call(join_leave, case.args, {})}:\n  {symptom}")
    return check_cases(join_leave, cases)
