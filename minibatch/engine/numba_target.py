"""What Numba compiles the CPU kernels for: this CPU, with its widest vectors where it has AVX-512.

Numba asks LLVM for code for the host CPU. On Intel CPUs with AVX-512, LLVM's tuning still prefers
256-bit vectors when it vectorises a loop by itself (512-bit instructions lowered the clock of the
first such CPUs), so a loop such as the quantised kernels' (`kernels.quantized_groups_numba`) runs in
eight lanes where the CPU has sixteen. Turning that preference off lets it use the whole register
(measurements: docs/performance.md, section "Wide vectors"). CPUs without the preference (AMD's) or
without AVX-512 compile as before. A NUMBA_CPU_FEATURES set by the user is left as it is.

It must run before Numba builds its compiler, that is before the first compiled function is defined:
`minibatch.engine` imports this module first, and every kernel module is inside it.
"""
from __future__ import annotations

import os
import sys

import llvmlite.binding as llvm

NARROW_PREFERENCE = "prefer-256-bit"     # LLVM's name of the tuning this module turns off


def prefer_wide_vectors() -> bool:
    """Let LLVM vectorise loops in 512 bits on an AVX-512 CPU. True when it set that for this process."""
    features = llvm.get_host_cpu_features()
    if "NUMBA_CPU_FEATURES" in os.environ or not features.get("avx512f", False):
        return False
    wanted = f"{features.flatten()},-{NARROW_PREFERENCE}"
    if "numba" in sys.modules:           # Numba's configuration was read already: set it there too
        from numba.core import config
        config.CPU_FEATURES = wanted
    os.environ["NUMBA_CPU_FEATURES"] = wanted
    return True


WIDE_VECTORS = prefer_wide_vectors()
# what the code Numba compiles has: its features, or else the host's
_COMPILED = (os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()).split(",")
AVX512 = "+avx512f" in _COMPILED              # 512-bit registers (`kernels.lanes16`)?
AVX512_BF16 = "+avx512bf16" in _COMPILED      # bfloat16 products pair by pair (`kernels.pairs_bf16`)?
AMX_BF16 = "+amx-tile" in _COMPILED and "+amx-bf16" in _COMPILED   # bfloat16 tiles (`kernels.tiles_bf16`)?
