"""Exercise checkers: run the learner's function on known cases and say how it went.

An exercise cell ends by handing the learner's function to its chapter's checker:

    result = check_slot_of(slot_of)

- while the function still raises NotImplementedError (the stub), the checker prints "not solved
  yet" and returns CheckResult(solved=False), raising nothing, so the notebook keeps running;
- a wrong answer raises AssertionError naming the input, the expected value and what came back;
- when every case is right it prints a success line and returns CheckResult(solved=True).

A checker is a function decorated with `@checker(title)`: it receives the learner's function(s),
compares answers with `check_cases` (or plain `assert cond, message`) and may return how many
cases it ran. The infrastructure is in `minibatch.checks.core`; each chapter's checkers are in a module of their own.
"""
from minibatch.checks.core import Case, CheckResult, check_cases, checker, describe, describe_call, same_value
from minibatch.checks.static_batching import Queued, check_admit_static, check_held_slot_steps
from minibatch.checks.continuous_batching import Running, Waiting, check_join_leave
from minibatch.checks.sla import check_latency_metrics, check_pick_config
from minibatch.checks.policies import check_policy_lab
from minibatch.checks.small_models import check_batch_for_fixed_share, check_overhead_share
from minibatch.checks.speculation import check_speculation_speedup, check_verify_greedy
from minibatch.checks.serving import check_read_load
from minibatch.checks.memory import check_append_token, check_paged_decode_attention
from minibatch.checks.kv_budget import check_kv_prediction
from minibatch.checks.latency import check_added_ttft, check_batch_timeout
from minibatch.checks.monitoring import check_histogram_quantile
from minibatch.checks.capstone import check_capstone
from minibatch.checks.why_batch import check_knee_prediction, check_roofline_tokens_per_s
from minibatch.checks.chunking import (check_budget_scheduler, check_burst_lab, check_long_prompt_ttft,
                                      check_pick_token_budget)
from minibatch.checks.slm_vs_llm import check_saturating_batch
from minibatch.checks.prefix_caching import check_prefix_hits
from minibatch.checks.build import check_allocator, check_built_engine, check_prefix_hash, check_scheduler
from minibatch.checks.build_kernel import check_attend
