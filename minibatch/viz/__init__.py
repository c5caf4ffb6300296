"""Pictures of a run, as pure functions that take records and return a matplotlib Figure.

Nothing here runs the engine: every function draws what a `RunReport` (or another record)
already holds, so the same figure can be drawn in a notebook, a widget or a test.
"""
from minibatch.viz.timeline import SlotChange, SlotRun, slot_changes, slot_occupancy, slot_runs, slot_timeline
from minibatch.viz.latency import latency_cdf, pareto_rows, sla_map, throughput_latency
from minibatch.viz.load import load_over_time, step_series
from minibatch.viz.profile import fixed_cost_figure, per_token_profile, step_profile
from minibatch.viz.edge import (edge_vs_server, formats_vs_bounds, request_lanes, speculation_speedups,
                                speedup_vs_batch)
from minibatch.viz.serving import latency_vs_load, metrics_over_time
from minibatch.viz.kv_map import (block_owners, block_table_figure, kv_block_map, kv_usage, peak_step,
                                  shared_blocks, step_usage)
from minibatch.viz.phases import budget_tradeoff, decode_token_waits, step_durations, step_time_vs_tokens, step_tokens
from minibatch.viz.bench import balance_figure, bench_figure
from minibatch.viz.queueing import load_sweep_figure
from minibatch.viz.calibration import step_ratio_figure, timeout_figure
