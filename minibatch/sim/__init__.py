"""The simulator: the simulated clock, the cost models it reads step times from, the measured and
modelled machine profiles, and the shape-only stand-ins that let a run skip the model entirely."""
