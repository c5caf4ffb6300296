"""Matrix products for decode-sized batches: each weight stored the way its product runs fastest.

A decode step multiplies a few rows (one per sequence) by every weight matrix, so a step should
cost about one read of the weights whether it has 1 or 8 rows (the roofline). Measured on this
course's CPU (AMD EPYC, AVX-512 with BF16 and VNNI, 2 threads, nothing else running), the 30
layers' products of SmolLM2-135M in fp32, one step's worth (425 MB of weights: 13 ms at 32 GB/s):

    rows                                   1        8       32
    F.linear (MKL, rows first)           51 ms    62 ms   101 ms
    oneDNN, weight prepacked at load   27.5 ms  28.5 ms    54 ms    (flat from 1 to 8 rows)

MKL's small-GEMM path runs 2-16 rows at 7-13 GB/s; asking it weight-first, (W @ x^T)^T, streams
each weight once for all rows and sits between the two.

oneDNN's prepacked path (`torch.ops.mkldnn`) reorders each weight once, at load, into the blocked
layout its kernels read; it wins at every row count measured here, and in bfloat16 on a CPU with
native BF16 instructions it reads half the bytes. So a `Linear` on a CPU whose torch has oneDNN
(fp32, or bf16 where the CPU supports it) holds the prepacked weight; elsewhere it keeps the plain
weight and uses the weight-first orientation up to SMALL_BATCH_ROWS rows (MKL), `F.linear` above
that, and `F.linear` on GPUs. The choice is made once per weight, from what the machine offers,
not from a timing taken at load: on a laptop shared with other work a 2-second timing picks by
noise, and a request's tokens would then depend on that noise. Every path computes the same
product in fp32 (or bf16) arithmetic; only the order of the sums differs.

A few rows are (nearly) a matrix-vector product, which no library path above streams at memory
speed (oneDNN's one-row product reads at about 20 GB/s here, two-thirds of the copy bandwidth, and
its eight-row product takes 1.7 times its one-row product). So a float32 or bfloat16 Linear on a
CPU also keeps its plain weight (bfloat16 as its bits, `kernels.bfloat16`), and up to `STREAM_ROWS`
(64) rows it runs `engine.kernels.gemv_cpu`'s loop, which reads each weight once at about the copy
bandwidth and multiplies it into eight rows at a time while it sits in a register (above eight rows,
blocks of four rows by six or four weight rows). With oneDNN that is a second copy of the weights in memory
(538 MB more for SmolLM2-135M in float32, 269 MB in bfloat16): the price of decode steps that run as
whole compiled layers (`kernels.layer_cpu`), a quarter to a third shorter up to 12 sequences, and
6-26% shorter from 16 to 48 (oneDNN's products part by part there before). In bfloat16 oneDNN's own
product is as fast as the loop at 1-8 rows on a CPU with BF16 instructions, but only the loop runs
inside a compiled layer. Above STREAM_ROWS rows (a prefill chunk) oneDNN's packed GEMM is faster.

A CPU with AMX (Intel's tile unit: Sapphire Rapids and later) multiplies bfloat16 tiles of 16 rows
in one instruction, and oneDNN's bfloat16 product uses it: there a product of more than a few rows
is bound by the memory alone, where the loop's vector multiply-adds are not. On a 2-core Xeon with
AMX (`python scripts/linear_ab.py --dtype bfloat16`, layers + head) oneDNN took 16.3 / 16.8 / 17.1 /
19.6 ms at 8 / 12 / 16 / 32 rows, the loop 19.1 / 24.0 / 31.3 / 54.5; but only the loop runs inside
a compiled layer, and whole decode steps (`python scripts/layer_ab.py --dtype bfloat16 --parts-onednn
--batch-sizes 4 8 12 16 32 --rounds 3`: compiled layers against oneDNN part by part) took 20.1 / 22.7 /
28.6 / 35.7 / 67.0 ms against 24.1 / 25.9 / 27.8 / 29.5 / 37.6. So on such a CPU a bfloat16 weight is
streamed up to TILE_STREAM_ROWS (8) rows only, and oneDNN multiplies more, part by part.

    python scripts/linear_ab.py      # every path on this machine, for the model's shapes
"""
from __future__ import annotations

import llvmlite.binding as llvm
import torch
import torch.nn.functional as F

from minibatch.engine.kernels.bfloat16 import host_view, supported
from minibatch.engine.kernels.gemv_cpu import STREAM_ROWS, streamed_linear

SMALL_BATCH_ROWS = 64   # up to this many rows, the weight-first orientation is used on CPU without oneDNN
TILE_STREAM_ROWS = 8    # bfloat16 on a CPU with AMX tiles: oneDNN above this many rows (see above)
PATHS = ("onednn", "weight-first", "f.linear")
AMX_BF16 = llvm.get_host_cpu_features().get("amx-bf16", False)   # does this CPU multiply bfloat16 tiles?


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (T, K) times weight (N, K) transposed: (T, N), MKL asked weight-first for decode-sized T on CPU."""
    rows = x.shape[0]
    if x.device.type != "cpu" or rows > SMALL_BATCH_ROWS or rows == 0:
        return F.linear(x, weight)
    if rows == 1 and torch.get_num_threads() > 1:
        x = torch.cat((x, x.new_zeros(1, x.shape[1])))                  # (2, K): a zero row, dropped below
    return torch.mm(weight, x.t())[:, :rows].t()                         # (N, T) computed, (T, N) view


def onednn_supports(weight: torch.Tensor) -> bool:
    """Whether oneDNN can run products with this weight's dtype on this machine's CPU."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


def best_path(weight: torch.Tensor) -> str:
    """The path a Linear of this weight takes: oneDNN where it runs, else the plain BLAS paths."""
    return "onednn" if onednn_supports(weight) else "weight-first" if weight.device.type == "cpu" else "f.linear"


def streamed_rows(weight: torch.Tensor, path: str) -> int:
    """Up to how many rows a product by this weight takes the streamed loop (0: never)."""
    if weight.device.type != "cpu" or not supported(weight.dtype):
        return 0
    if path == "onednn" and weight.dtype == torch.bfloat16 and AMX_BF16:
        return TILE_STREAM_ROWS
    return STREAM_ROWS


class Linear:
    """A weight (N, K) and its product x (T, K) -> (T, N), the same as F.linear(x, weight)."""

    def __init__(self, weight: torch.Tensor, path: str | None = None, stream_rows: int | None = None):
        """`path` for the products of many rows (the best for this machine by default); up to `stream_rows`
        rows of a float32 or bfloat16 weight on a CPU take the streamed loop (0: never; by default
        `streamed_rows`)."""
        path = path or best_path(weight)
        if path not in PATHS:
            raise ValueError(f"Linear path={path!r} is not allowed: choose one of {PATHS}")
        if path == "onednn" and not onednn_supports(weight):
            raise ValueError(f"Linear path='onednn' is not allowed for a {weight.dtype} weight on "
                             f"{weight.device.type}: oneDNN runs float32 (and bfloat16 where the CPU has it) on CPU")
        self.path, self.shape, self.dtype = path, weight.shape, weight.dtype
        if stream_rows is None:
            stream_rows = streamed_rows(weight, path)
        self.stream_rows = stream_rows if weight.device.type == "cpu" and supported(weight.dtype) else 0
        self.streamed = host_view(weight.detach().contiguous()) if self.stream_rows else None  # (N, K) plain weight
        if path == "onednn":
            with torch.no_grad():                                        # reordered once, into oneDNN's blocked layout
                self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(T, K) -> (T, N)."""
        if 0 < x.shape[0] <= self.stream_rows:
            return streamed_linear(x, self.streamed)
        if self.path == "onednn":
            if x.shape[0] == 0:
                return x.new_empty(0, self.shape[0])
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        if self.path == "weight-first":
            return linear(x, self.weight)
        return F.linear(x, self.weight)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual (T, N) + x (T, K) times the weight: oneDNN and the streamed loop add the residual as they
        write the product."""
        if 0 < x.shape[0] <= self.stream_rows:
            return streamed_linear(x, self.streamed, residual)
        if self.path == "onednn" and x.shape[0] > 0:
            return torch.ops.mkldnn._linear_pointwise(x, residual, self.weight, None, "add")
        return residual + self(x)

    def layer_operands(self, rows: int) -> tuple | None:
        """What the compiled decode layer (`kernels.layer_cpu`) multiplies by at `rows` rows: the plain
        weight, where the streamed loop runs that many rows; None elsewhere."""
        return (self.streamed,) if 0 < rows <= self.stream_rows else None

    def numel(self) -> int:
        """Number of weights, N x K (whatever layout the packed copy has)."""
        return self.shape.numel()

    def element_size(self) -> int:
        """Bytes per weight: 4 in float32, 2 in bfloat16."""
        return self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes a product reads from the weight."""
        return self.numel() * self.element_size()

    def __repr__(self):
        return f"Linear({tuple(self.shape)}, {self.dtype}, path={self.path!r})"
