"""ipywidgets panels built on `minibatch.viz`: sliders and switches that rerun a workload and redraw."""
from minibatch.widgets.dashboard import Dashboard
from minibatch.widgets.tuner import TunerPanel
from minibatch.widgets.edge import EdgeModePanel
