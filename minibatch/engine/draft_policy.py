"""How many drafts each request proposes: as many as pay, and none when drafting would slow it down.

Speculation pays when a step's expected tokens outgrow its cost: k drafts, each accepted with
probability a, yield E(a, k) = 1 + a + ... + a^k tokens in a step that costs c(k) plain steps (the
verify pass's k extra rows, and a draft model's own passes). A request gains E(a, k) / c(k) times
plain decoding's tokens per unit of time. `DraftPolicy` keeps the two numbers that decide it:

- each request's acceptance rate a, from its own verify outcomes, with older steps weighing less
  (a request that starts copying its input later is noticed within a few steps);
- the engine's step time by the number of rows a decode step runs, measured on the steps themselves
  (the fastest of the recent ones: other programs only ever slow a step down, so the fastest is the
  step's own cost), so c(k) is this machine's, this proposer's and this batch's, never assumed.

Each step it picks, per request, the k in 1..k_max with the largest E(a, k) / c(k), provided that
gain clears `min_gain` (a margin above 1: both numbers are estimates, and a draft that only breaks
even is not worth the risk of slowing the request); else k = 0. Then the request stops drafting for
`backoff_steps` of its steps, and probes with one draft (a cheap re-check: a request whose output
becomes grounded later wins again); each probe that fails doubles the wait, up to `max_backoff_steps`,
so a proposer that never pays costs almost nothing. A step in which nobody drafts runs exactly what
plain decoding runs. Before any plain step of a batch size was timed, the policy asks for one
(k = 0): every cost is relative to it. It decides for greedy requests only, whose tokens do not
depend on k; a sampled request drafts k every step, so its seed repeats its sample.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


def expected_tokens_per_step(acceptance_rate: float, k: int) -> float:
    """Tokens a step yields when each draft is accepted with probability a: 1 + a + ... + a^k."""
    a = acceptance_rate
    return k + 1.0 if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class RequestAcceptance:
    """One request's recent verify outcomes: accepted drafts and draft positions the model reached
    (accepted ones plus each first rejection), both decayed; and whether it is switched off."""

    accepted: float
    reached: float
    steps: int = 0                 # this request's decode steps so far
    off_until: int = 0             # switched off: no drafts before this step
    backoff: int = 0               # steps the next switch-off lasts (0: the policy's first backoff)
    probing: bool = False          # after the backoff: one draft per step until a verify outcome arrives

    @property
    def rate(self) -> float:
        return self.accepted / self.reached


class DraftPolicy:
    """Per-request number of drafts: the k maximising expected tokens per step over measured step cost."""

    def __init__(self, k_max: int, backoff_steps: int = 16, decay: float = 0.8, prior_rate: float = 0.5,
                 window: int = 16, min_gain: float = 1.1, max_backoff_steps: int = 256):
        self.k_max = k_max                  # the most drafts a step proposes (EngineConfig.num_speculative_tokens)
        self.min_gain = min_gain            # drafting must promise this many times plain decoding's tokens/s
        self.backoff_steps = backoff_steps  # steps a switched-off request runs plain before it probes again
        self.max_backoff_steps = max(max_backoff_steps, backoff_steps)  # the longest wait, after failed probes
        self.decay = decay                  # weight of a request's earlier outcomes at each new one
        self.prior_rate = prior_rate        # a request's acceptance before any outcome, worth one draft position
        self.step_times: dict[int, deque] = {}  # rows in a decode step -> its latest durations (s)
        self.costs: dict[tuple[int, int], float | None] = {}  # (batch, k) -> step_cost, until the next step
        self.window = window                # durations kept per row count
        self.requests: dict[int, RequestAcceptance] = {}

    # --- what the policy learns ------------------------------------------------------------------

    def observe_step(self, rows: int, duration_s: float) -> None:
        """A decode step (no prompt tokens in it) ran `rows` rows (sequences plus drafts) in duration_s."""
        self.step_times.setdefault(rows, deque(maxlen=self.window)).append(duration_s)
        self.costs.clear()                                        # step costs may have moved

    def observe_outcome(self, request_id: int, drafted: int, accepted: int) -> None:
        """A request's drafts were verified: `accepted` of `drafted` kept (greedy or rejection sampling)."""
        state = self._state(request_id)
        reached = accepted + (accepted < drafted)                 # the first rejected draft was reached too
        state.accepted = self.decay * state.accepted + accepted
        state.reached = self.decay * state.reached + reached
        state.probing = False

    def release(self, request_id: int) -> None:
        self.requests.pop(request_id, None)

    # --- what it decides ---------------------------------------------------------------------------

    def step_time(self, rows: int) -> float | None:
        """A decode step's time at `rows` rows: the fastest of recent ones; between measured row counts
        the straight line through the nearest two; past the largest measured, the largest one's (an
        optimistic guess, tried once and then measured); None before any step of fewer rows ran."""
        if rows in self.step_times:
            return min(self.step_times[rows])
        below = [r for r in self.step_times if r < rows]
        if not below:
            return None
        low = max(below)
        above = [r for r in self.step_times if r > rows]
        if not above:
            return self.step_time(low)
        high = min(above)
        t_low, t_high = self.step_time(low), self.step_time(high)
        return t_low + (t_high - t_low) * (rows - low) / (high - low)

    def step_cost(self, batch: int, k: int) -> float | None:
        """A decode step of `batch` sequences with k more rows, in plain steps of that batch (None: unknown)."""
        plain, verify = self.step_time(batch), self.step_time(batch + k)
        return None if plain is None else verify / plain

    def best_k(self, rate: float, batch: int, k_max: int) -> int:
        """The k in 1..k_max with the largest expected tokens per step over step cost, if that gain clears
        min_gain; else 0 (drafting would slow the request, or gain too little to be sure it does not)."""
        gains = {k: expected_tokens_per_step(rate, k) / self._cost(batch, k) for k in range(1, k_max + 1)}
        best = max(gains, key=gains.get)
        return best if gains[best] >= self.min_gain else 0

    def num_drafts(self, request_id: int, batch: int, room: int) -> int:
        """Drafts this request proposes in a step of `batch` decoding sequences with room for `room` of them."""
        state = self._state(request_id)
        state.steps += 1
        if room == 0 or self.step_time(batch) is None:      # no room, or the plain step is not measured yet
            return 0
        if state.steps < state.off_until:
            return 0                                         # switched off: plain steps until the backoff ends
        if state.probing:
            return 1                                         # the backoff ended: probe with one draft
        k = self.best_k(state.rate, batch, min(room, self.k_max))
        if k == 0:                                           # drafting would slow this request: switch off
            state.backoff = min(2 * state.backoff, self.max_backoff_steps) if state.backoff else self.backoff_steps
            state.off_until, state.probing = state.steps + state.backoff, True
        else:
            state.backoff = 0                                # drafting pays: a later switch-off starts short
        return k

    def _cost(self, batch: int, k: int) -> float | None:
        """step_cost, computed once per observed step: every request of a step asks the same questions."""
        if (batch, k) not in self.costs:
            self.costs[batch, k] = self.step_cost(batch, k)
        return self.costs[batch, k]

    def _state(self, request_id: int) -> RequestAcceptance:
        if request_id not in self.requests:
            self.requests[request_id] = RequestAcceptance(accepted=self.prior_rate, reached=1.0)
        return self.requests[request_id]
