"""Fused LayerNorm with fp32 statistics: each row is read once into registers; backward computes dx
and the partial dgamma/dbeta sums in the same pass (PyTorch's eager backward reads x and dy twice)."""
from __future__ import annotations

import torch

from kernels import reference, runtime

FILE = "layer_norm.cu"


class FusedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                fwd: runtime.RowLayout, bwd: runtime.RowLayout) -> torch.Tensor:
        cols = weight.numel()
        rows = x.numel() // cols
        y = torch.empty_like(x)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        sms = runtime.multiprocessors(x.device)
        runtime.launch(FILE, runtime.expression("layer_norm_fwd", x.dtype, fwd), (fwd.grid(rows, sms),), (fwd.threads,),
                       (x, weight, bias, y, mean, rstd, runtime.i64(rows), runtime.i32(cols), runtime.f32(eps)),
                       max_regs=fwd.max_regs)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bwd = bwd
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, weight, mean, rstd = ctx.saved_tensors
        lay: runtime.RowLayout = ctx.bwd
        dy = runtime.aligned(dy)
        cols = weight.numel()
        rows = x.numel() // cols
        dx = torch.empty_like(x)
        blocks = lay.grid(rows, runtime.multiprocessors(x.device))
        parts = torch.empty(2, blocks, cols, dtype=torch.float32, device=x.device)
        shared = runtime.backward_shared_bytes(lay, cols)
        runtime.launch(FILE, runtime.expression("layer_norm_bwd", x.dtype, lay), (blocks,), (lay.threads,),
                       (dy, x, weight, mean, rstd, dx, parts[0], parts[1], runtime.i64(rows), runtime.i32(cols)), shared_mem=shared,
                       max_regs=lay.max_regs)
        sums = sum_parts(parts, weight.dtype)
        return dx, sums[0].view_as(weight), sums[1].view_as(weight), None, None, None


PARTS_SUM_THREADS = 1024  # layer_norm_parts_sum's block: 128 partial rows in flight per 8 columns
PARTS_SUM_COLS = 8  # its columns per block (its COLS): a warp's groups of 8 lanes read a 32-byte sector each


def parts_sum_expression(dtype: torch.dtype) -> str:
    return runtime.expression("layer_norm_parts_sum", dtype, PARTS_SUM_COLS)


def sum_parts(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[2, cols] of `dtype`: the backward's [2, blocks, cols] fp32 partial dgamma/dbeta rows added up
    in a fixed order, one kernel (torch's sum then cast took two; ~15 of the backward's 72 us on the H100)."""
    assert parts.dtype == torch.float32 and parts.is_contiguous() and parts.shape[0] == 2
    _, blocks, cols = parts.shape
    out = torch.empty(2, cols, dtype=dtype, device=parts.device)
    runtime.launch(FILE, parts_sum_expression(dtype), (-(-cols // PARTS_SUM_COLS), 2), (PARTS_SUM_THREADS,),
                   (parts, out, runtime.i32(blocks), runtime.i32(cols)))
    return out


def layouts(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """(forward, backward) row layouts of the fused path for these tensors, or None where it does not
    apply (dtype, device, a row too long for registers)."""
    cols = x.shape[-1]
    if not runtime.supports(x, weight, bias) or weight.numel() != cols:
        return None
    vec = runtime.vector_width(cols, x, weight, bias)
    # rows of up to 128 vectors a warp each (1024 bf16 features: 0.79 of peak bandwidth on the H100,
    # a block of 128 threads 0.72: the block's barriers); the backward's registers allow no such layout
    fwd = runtime.row_layout(FILE, "layer_norm_fwd", x.dtype, cols, vec, 8, x.device.index, warp_slots=4)
    bwd = runtime.row_layout(FILE, "layer_norm_bwd", x.dtype, cols, vec, 4, x.device.index)
    return (fwd, bwd) if fwd and bwd else None


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5,
               fused: bool = True) -> torch.Tensor:
    """LayerNorm over the last dimension; the fused path when x, weight and bias share a CUDA float dtype
    (without a weight or a bias, or with mixed dtypes, F.layer_norm's)."""
    lay = layouts(x, weight, bias) if fused else None
    if lay:
        return FusedLayerNorm.apply(x, weight, bias, eps, *lay)
    return reference.layer_norm(x, weight, bias, eps)
