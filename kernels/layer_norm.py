"""Fused LayerNorm with fp32 statistics: each row is read once into registers; backward computes dx
and the partial dgamma/dbeta sums in the same pass (PyTorch's eager backward reads x and dy twice),
which kernels/partial_sums.py adds up."""
from __future__ import annotations

import torch

from kernels import partial_sums, reference, runtime

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
        sums = partial_sums.sum_partials(parts, weight.dtype)
        return dx, sums[0].view_as(weight), sums[1].view_as(weight), None, None, None


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
