"""Plain-torch versions of every fused kernel: the path taken without a GPU or CuPy, and the oracle the
fused kernels are tested against. Each computes in fp32 and returns the input's dtype, as the kernels do,
but for bias_gelu's addition, which is eager torch's in the input's dtype (the fused kernel adds in fp32:
in bf16 the two are up to 1 ulp apart; the GPU tests compare both with a float64 reference)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias, approximate="tanh")


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def causal_mask(sq: int, sk: int, device) -> torch.Tensor:
    """True above the diagonal: the positions Megatron's upper-triangular mask removes."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


def scaled_causal_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * x) over the last dim with columns c > row masked, in fp32, returned in x's dtype."""
    scores = (x.to(torch.promote_types(x.dtype, torch.float32)) * scale).masked_fill(causal_mask(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    return torch.softmax(scores, dim=-1).to(x.dtype)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         ignore_index: int = -100, reduction: str = "mean",
                         group: dist.ProcessGroup | None = None, vocab_start: int = 0) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T` against `target`, where `weight` is this rank's slice of a
    vocabulary split across `group` (Megatron's vocab-parallel cross-entropy; one rank: plain
    F.cross_entropy). The full logits of this slice are materialised: that is what the fused path avoids."""
    logits = (hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32))
    valid = target != ignore_index
    local = target - vocab_start
    in_slice = valid & (local >= 0) & (local < logits.shape[-1])
    row_max = logits.max(dim=-1).values
    if group is not None:
        row_max = _all_reduce(row_max.detach(), dist.ReduceOp.MAX, group)
    shifted = logits - row_max.detach().unsqueeze(-1)
    sum_exp = shifted.exp().sum(dim=-1)
    picked = shifted.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1) * in_slice
    if group is not None:
        sum_exp = _AllReduceSum.apply(sum_exp, group)
        picked = _AllReduceSum.apply(picked, group)
    losses = (sum_exp.log() - picked) * valid
    total = losses.sum()
    return total / valid.sum().clamp(min=1) if reduction == "mean" else total


def _all_reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    dist.all_reduce(t, op=op, group=group)
    return t


class _AllReduceSum(torch.autograd.Function):
    """Sum across ranks forward; the gradient of a sum of replicas is the incoming gradient."""

    @staticmethod
    def forward(ctx, t, group):
        return _all_reduce(t.clone(), dist.ReduceOp.SUM, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None
