"""ipywidgets panels built on `minibatch.viz`: sliders and switches that rerun a workload and redraw."""
from minibatch.widgets.edge import EdgeModePanel
from minibatch.widgets.timeline import TimelineScrubber
from minibatch.widgets.batching import BatchingPanel
from minibatch.widgets.dashboard import Dashboard
from minibatch.widgets.tuner import TunerPanel
from minibatch.widgets.kv_map import BlockTableExplorer, KVMapScrubber
from minibatch.widgets.chunking import ChunkingPanel
from minibatch.widgets.playground import PlaygroundPanel
from minibatch.widgets.load_sweep import LoadSweepPanel
from minibatch.widgets.prefix_cache import PrefixCachePanel
