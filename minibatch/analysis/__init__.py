"""Analysis: what a run means. Run reports, memory, step profiles, SLA and goodput, the tuner,
calibration, and the measured claims each chapter closes with."""
