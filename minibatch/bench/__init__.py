"""Benchmarks: minibatch against its peers (`suite`, the `bench` command), the roofline, speculative
decoding for one user (`speculative`), attention kernel timings (`kernels`) and the static versus
continuous demo (`demo`)."""
