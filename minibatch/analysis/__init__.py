"""Analysis: what a run means. Run reports, memory, step profiles, SLA and goodput, queueing, the
roofline, and the measured claims each chapter closes with; it never builds an engine."""
