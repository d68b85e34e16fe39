"""Fused bias + GeLU (tanh form): one read and one write forward; backward gives dx and dbias in one
pass over dy and x (Megatron's bias_gelu, as a CuPy kernel)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import partial_sums, reference, runtime

FILE = "bias_gelu.cu"


@dataclass(frozen=True)
class Tiling:
    """The backward's launch: blocks of up to `threads` over the columns (one thread per vector of
    columns) and enough row chunks for about `threads_per_sm` threads per multiprocessor; each thread
    walks its chunk's rows (contiguous, or every chunks-th row when `interleaved`) with `rows` rows'
    loads in flight (`prefetch`, one row: the next row's loads issued before this row's work), and each
    chunk writes one partial dbias row."""
    rows: int = 1
    threads: int = 512
    threads_per_sm: int = 1024
    interleaved: bool = True
    prefetch: bool = False

    def __post_init__(self):
        if self.prefetch and self.rows != 1:
            raise ValueError(f"a prefetching tiling holds one next row, not {self.rows}")

    def expression(self, dtype: torch.dtype, vec: int) -> str:
        """The backward's template instantiation for this tiling."""
        return runtime.expression("bias_gelu_bwd", dtype, vec, self.rows, self.interleaved,
                                  *([True] if self.prefetch else []))

    def geometry(self, rows: int, cols: int, vec: int, multiprocessors: int) -> tuple[int, int, int]:
        """(threads, column blocks, row chunks)."""
        nvec = cols // vec
        threads = min(self.threads, 32 * -(-nvec // 32))
        col_blocks = -(-nvec // threads)
        per_wave = multiprocessors * self.threads_per_sm // (threads * col_blocks)
        return threads, col_blocks, max(1, min(rows // 16 or 1, per_wave))


# measured on the H100 at 16384 x 4096 bf16 (benchmarks.kernel_sweep, fraction of peak bandwidth):
# 2 rows in flight, 1024 threads per multiprocessor, contiguous chunks 0.62; 1 row 0.82; 1 row with
# interleaved chunks 0.84 (more rows in flight left fewer threads resident). On the H200 it stays the
# fastest: 0.122 ms, prefetching the next row 0.128, 2 rows 0.129, contiguous chunks 0.126
BACKWARD = Tiling()  # the defaults above
# every backward tiling whose kernel the nvcc check compiles (threads aside): the default's and the sweep's others
BACKWARD_TILINGS = (BACKWARD, Tiling(rows=2), Tiling(interleaved=False), Tiling(prefetch=True))


def _forward(x: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> None:
    """Grid-stride, one vector per thread per step (on the H100 it moved 0.90 of peak; kernels walking
    tiles of rows with the bias in registers, 0.84 at best)."""
    cols = bias.numel()
    vec = runtime.vector_width(cols, x, bias, y)
    n_vec = x.numel() // vec
    blocks = min((n_vec + 255) // 256, runtime.multiprocessors(x.device) * 16)
    runtime.launch(FILE, runtime.expression("bias_gelu_fwd", x.dtype, vec), (blocks,), (256,),
                   (x, bias, y, runtime.i64(n_vec), runtime.i32(cols)))


class FusedBiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor, bwd: Tiling = BACKWARD) -> torch.Tensor:
        y = torch.empty_like(x)
        _forward(x, bias, y)
        ctx.save_for_backward(x, bias)
        ctx.bwd = bwd
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, bias = ctx.saved_tensors
        dy = runtime.aligned(dy)
        cols, rows = bias.numel(), x.numel() // bias.numel()
        dx = torch.empty_like(x)
        vec = runtime.vector_width(cols, x, bias, dy, dx)
        threads, col_blocks, chunks = ctx.bwd.geometry(rows, cols, vec, runtime.multiprocessors(x.device))
        partial = torch.empty(chunks, cols, dtype=torch.float32, device=x.device)
        runtime.launch(FILE, ctx.bwd.expression(x.dtype, vec), (col_blocks, chunks),
                       (threads,), (dy, x, bias, dx, partial, runtime.i64(rows), runtime.i32(cols)))
        dbias = partial_sums.sum_partials(partial[None], bias.dtype).view_as(bias)
        # one gradient per input given to apply(): the tiling is optional
        return (dx, dbias) + (None,) * (len(ctx.needs_input_grad) - 2)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """gelu_tanh(x + bias) with `bias` over the last dimension of `x`."""
    if fused and x.shape[-1] == bias.numel() and runtime.supports(x, bias):
        return FusedBiasGelu.apply(x, bias)
    return reference.bias_gelu(x, bias)
