"""Print the pip options that choose where torch comes from; `make venv` and `make wheelhouse` use them.

PyPI's Linux wheel of torch bundles CUDA and pulls in several GB of NVIDIA libraries; PyTorch's own CPU
index has the same release without them (torch 2.13.0+cpu, which satisfies the pin torch==2.13.0). So:
- TORCH_INDEX given (`make lab TORCH_INDEX=...`): `--index-url TORCH_INDEX`, whatever the machine;
- Linux without an NVIDIA GPU (no nvidia-smi, no /proc/driver/nvidia) and the CPU index answers within
  a few seconds: `--extra-index-url` that index (pip then prefers 2.13.0+cpu to PyPI's 2.13.0);
- otherwise nothing: PyPI's pin, as on macOS, Windows and GPU machines (and where that index is
  unreachable, e.g. behind a proxy that lets only PyPI through).
Only the options go to stdout; a line on stderr says which source was chosen and why.
Standard library only: it runs before the virtual environment exists.
"""
import os
import platform
import shutil
import sys
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5  # a blocked index must not hold up the install for long


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver is loaded or its tool is on PATH."""
    return os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi") is not None


def reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """The index answers an HTTP request within timeout_s (pip's own proxy variables apply)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout_s):
            return True
    except (OSError, ValueError):  # URLError, timeouts and refused connections are OSErrors
        return False


def torch_source(explicit_index: str = "", system: str | None = None) -> tuple[list[str], str]:
    """(pip options, the reason in words) for installing or downloading torch on this machine."""
    if explicit_index:
        return ["--index-url", explicit_index], f"torch from TORCH_INDEX={explicit_index}"
    system = system or platform.system()
    if system != "Linux":
        return [], f"torch from PyPI ({system}: its wheel has no bundled CUDA to avoid)"
    if has_nvidia_gpu():
        return [], "torch from PyPI (NVIDIA GPU found: the CUDA build)"
    if reachable(CPU_INDEX):
        return ["--extra-index-url", CPU_INDEX], f"torch's CPU build from {CPU_INDEX} (Linux, no NVIDIA GPU)"
    return [], (f"torch from PyPI's pin: {CPU_INDEX} did not answer within {PROBE_TIMEOUT_S} s "
                "(pip still takes a CPU wheel of the pinned release if one is at hand)")


if __name__ == "__main__":
    options, reason = torch_source(os.environ.get("TORCH_INDEX", ""))
    print(f"setup: {reason}", file=sys.stderr)
    print(" ".join(options))
