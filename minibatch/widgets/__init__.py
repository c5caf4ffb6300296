"""ipywidgets panels built on `minibatch.viz`: sliders and switches that rerun a workload and redraw."""
