"""Pictures of a run, as pure functions that take records and return a matplotlib Figure.

Nothing here runs the engine: every function draws what a `RunReport` (or another record)
already holds, so the same figure can be drawn in a notebook, a widget or a test.
"""
from minibatch.viz.latency import latency_cdf, pareto_rows, sla_map, throughput_latency
from minibatch.viz.load import load_over_time, step_series
from minibatch.viz.profile import per_token_profile, step_profile
from minibatch.viz.edge import edge_vs_server, request_lanes
