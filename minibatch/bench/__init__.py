"""Benchmarks: minibatch against its peers (`suite`, the `bench` command; the peers themselves in `peers/`),
the measured roofline, speculative decoding for one user (`speculative`), attention kernel timings
(`kernels`) and the static versus continuous demo (`demo`). The bench writes its results; `viz` draws them."""
