"""Megatron-style tensor parallelism: the layers a GPT swaps in, with explicit autograd collectives.

- ColumnParallelLinear: the weight split by output rows; the input is copied to every rank (its
  gradient all-reduced in backward); the output stays split (or is gathered).
- RowParallelLinear: the weight split by input columns; the split input gives partial outputs that
  are all-reduced in forward (identity in backward); the bias is added once, after the sum.
- VocabParallelEmbedding: the vocabulary split in ranges; each rank looks up its own tokens, zeros
  the rest, and the partial embeddings are all-reduced.
The LM head's vocab-parallel cross-entropy is kernels.linear_cross_entropy(group=...).
With no group (tp = 1) every collective is the identity: the layers are plain nn.Linear / nn.Embedding.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import padded_vocab  # noqa: F401  (re-exported)


def world(group) -> tuple[int, int]:
    """(rank, size) in the tensor-parallel group; (0, 1) without one."""
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class _CopyToRegion(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (the input feeds every rank's shard)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromRegion(torch.autograd.Function):
    """All-reduce forward (sum of the ranks' partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    """Concatenate the ranks' last-dimension slices forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        rank, size = world(ctx.group)
        return grad.chunk(size, dim=-1)[rank].contiguous(), None


def copy_to_region(x, group):
    return x if group is None else _CopyToRegion.apply(x, group)


def reduce_from_region(x, group):
    return x if group is None else _ReduceFromRegion.apply(x, group)


def gather_from_region(x, group):
    return x if group is None else _GatherFromRegion.apply(x, group)


def _split(n: int, size: int, what: str) -> int:
    if n % size:
        raise ValueError(f"{what} {n} is not divisible by the tensor-parallel size {size}")
    return n // size


def _mark_sharded(*params) -> None:
    """DeepSpeed's gradient-norm counts a parameter on every tensor-parallel rank only when it is
    marked as split (`tensor_model_parallel`, Megatron's attribute); replicated ones count once."""
    for param in params:
        if param is not None:
            param.tensor_model_parallel = True


class _Sharded(nn.Module):
    """A layer holding this rank's part of a full parameter (its slicing is `local_part`)."""

    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Take this rank's part of a full (tp = 1) weight and bias."""
        with torch.no_grad():
            self.weight.copy_(local_part(self, "weight", weight))
            if getattr(self, "bias", None) is not None and bias is not None:
                self.bias.copy_(local_part(self, "bias", bias))


class ColumnParallelLinear(_Sharded):
    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True,
                 gather_output: bool = False):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        rank, size = world(group)
        self.out_local = _split(out_features, size, "output features")
        self.weight = nn.Parameter(torch.empty(self.out_local, in_features))
        self.bias = nn.Parameter(torch.zeros(self.out_local)) if bias else None
        _mark_sharded(self.weight, self.bias)

    def forward(self, x):
        y = F.linear(copy_to_region(x, self.group), self.weight, self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y


class RowParallelLinear(_Sharded):
    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True):
        super().__init__()
        self.group = group
        rank, size = world(group)
        self.in_local = _split(in_features, size, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        _mark_sharded(self.weight)  # the bias is added after the sum: replicated

    def forward(self, x_parallel):
        y = reduce_from_region(F.linear(x_parallel, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(_Sharded):
    def __init__(self, vocab: int, dim: int, group=None):
        super().__init__()
        self.group = group
        rank, size = world(group)
        self.vocab_local = _split(vocab, size, "vocabulary (pad it with padded_vocab)")
        self.vocab_start = rank * self.vocab_local
        self.weight = nn.Parameter(torch.empty(self.vocab_local, dim))
        _mark_sharded(self.weight)

    def forward(self, tokens):
        if self.group is None:
            return F.embedding(tokens, self.weight)
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_region(out, self.group)


def local_range(module: nn.Module, param: str, full_shape) -> tuple[int, int, int]:
    """(dim, start, stop): where this rank's part of a full (tp = 1) tensor lies for `module`'s
    parameter `param`: rows of a column-parallel weight or bias, columns of a row-parallel weight, a
    vocabulary range of the embedding; anything else (LayerNorm, position embedding, a row-parallel
    bias) is whole (dim 0, all of it)."""
    rank, _ = world(getattr(module, "group", None))
    if isinstance(module, ColumnParallelLinear):
        return 0, rank * module.out_local, (rank + 1) * module.out_local
    if isinstance(module, RowParallelLinear) and param == "weight":
        return 1, rank * module.in_local, (rank + 1) * module.in_local
    if isinstance(module, VocabParallelEmbedding):
        return 0, module.vocab_start, module.vocab_start + module.vocab_local
    return 0, 0, full_shape[0]


def local_part(module: nn.Module, param: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of a full (tp = 1) tensor for `module`'s parameter `param` (see local_range)."""
    dim, start, stop = local_range(module, param, full.shape)
    return full.narrow(dim, start, stop - start)


def full_shape(module: nn.Module, param: str, local: torch.Size) -> tuple[int, ...]:
    """The full (tp = 1) shape of `module`'s parameter `param` whose local part has shape `local`
    (the inverse of local_part's slicing)."""
    _, size = world(getattr(module, "group", None))
    shape = list(local)
    if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
        shape[0] *= size
    elif isinstance(module, RowParallelLinear) and param == "weight":
        shape[1] *= size
    return tuple(shape)


def load_full_state(model: nn.Module, state: dict) -> None:
    """Load a tp = 1 state dict into a tensor-parallel model (each rank keeps its part)."""
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            for name, param in module.named_parameters(recurse=False):
                key = f"{mod_name}.{name}" if mod_name else name
                param.copy_(local_part(module, name, state[key]))
