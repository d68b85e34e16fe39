"""A plain GPT decoder (MT-NLG / GPT-3 shape). Fused kernels from kernels/ swap in through
`ModelParams.fused_kernels`; with it off, or without a GPU, every op is plain torch."""
from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from trainer import rng
from trainer import tensor_parallel as tp
from trainer.config import ModelParams


def kernel_path(p: ModelParams, device: torch.device) -> str:
    """Which kernels the model runs on `device`: "fused", or "reference (why)" (recorded in checkpoints:
    a GPU where CuPy is unusable silently trains on the torch path otherwise)."""
    if not p.fused_kernels:
        return "reference (fused_kernels off)"
    if device.type != "cuda":
        return "reference (no GPU)"
    why = kernels.runtime.why_unavailable()
    return "fused" if why is None else f"reference ({why})"


class LayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float, fused: bool):
        super().__init__(dim, eps=eps)
        self.fused = fused

    def forward(self, x):
        return kernels.layer_norm(x, self.weight, self.bias, self.eps, fused=self.fused)


class Attention(nn.Module):
    """qkv features are laid out head by head ([head][q|k|v][head_dim], as Megatron), so a
    column-parallel split of qkv gives each tensor-parallel rank whole heads."""

    def __init__(self, p: ModelParams, group=None):
        super().__init__()
        self.p = p
        size = tp.world(group)[1]
        if p.n_head % size:
            raise ValueError(f"n_head {p.n_head} is not divisible by the tensor-parallel size {size}")
        self.heads = p.n_head // size
        self.split = size > 1  # this rank holds some heads only: their dropout draws from its own stream
        self.qkv = tp.ColumnParallelLinear(p.d_model, 3 * p.d_model, group)
        self.proj = tp.RowParallelLinear(p.d_model, p.d_model, group)
        self.drop = nn.Dropout(p.dropout)

    def forward(self, x, mask=None):
        """`mask` [batch, seq, seq], True where a query may attend (evaluation packs several
        continuations after one shared context); None: causal."""
        b, s, _ = x.shape
        hd = self.p.d_model // self.p.n_head
        q, k, v = self.qkv(x).view(b, s, self.heads, 3, hd).permute(3, 0, 2, 1, 4)
        heads_rng = rng.tensor_parallel_region(self.split and self.training and self.p.dropout > 0)
        if mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        elif self.p.attention == "sdpa":
            with heads_rng:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                     dropout_p=self.p.dropout if self.training else 0.0)
        else:
            # scaled in the matmul's epilogue, as Megatron's baddbmm(alpha=1/sqrt(hd)): unscaled fp16 scores
            # would overflow sqrt(hd) times sooner
            q3, k3 = q.reshape(-1, s, hd), k.reshape(-1, s, hd)
            # (beta 0: the input is not read; one element broadcast, not a second [b*h, s, s] buffer)
            scores = torch.baddbmm(q3.new_zeros(1, 1, 1), q3, k3.transpose(1, 2), beta=0.0,
                                   alpha=1.0 / math.sqrt(hd)).view(b, self.heads, s, s)
            probs = kernels.scaled_causal_softmax(scores, 1.0, fused=self.p.fused_kernels)
            with heads_rng:
                probs = self.drop(probs)
            out = probs @ v
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, s, self.heads * hd)))


class MLP(nn.Module):
    def __init__(self, p: ModelParams, group=None):
        super().__init__()
        self.group = group
        self.fc = tp.ColumnParallelLinear(p.d_model, 4 * p.d_model, group)
        self.proj = tp.RowParallelLinear(4 * p.d_model, p.d_model, group)
        self.drop = nn.Dropout(p.dropout)
        self.fused = p.fused_kernels

    def forward(self, x):
        # the column-parallel fc without its bias, which the fused bias + GeLU adds
        x = tp.copy_to_region(x, self.group)
        h = kernels.bias_gelu(F.linear(x, self.fc.weight), self.fc.bias, fused=self.fused)
        return self.drop(self.proj(h))


class Block(nn.Module):
    def __init__(self, p: ModelParams, group=None):
        super().__init__()
        self.ln1 = LayerNorm(p.d_model, p.layernorm_eps, p.fused_kernels)
        self.attn = Attention(p, group)
        self.ln2 = LayerNorm(p.d_model, p.layernorm_eps, p.fused_kernels)
        self.mlp = MLP(p, group)

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class WordEmbedding(tp.VocabParallelEmbedding):
    """The token embedding and, tied to it, the LM head: the pipeline places this one module on the
    first stage (lookup) and the last (head), and DeepSpeed sums its gradient across the two."""

    def __init__(self, p: ModelParams, group=None):
        super().__init__(p.vocab_size, p.d_model, group)
        self.fused = p.fused_kernels

    def enter_head(self, h: torch.Tensor) -> torch.Tensor:
        """The hidden states enter the head's tensor-parallel region (each rank scores its vocabulary slice)."""
        return tp.copy_to_region(h, self.group)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return tp.gather_from_region(h @ self.weight.t(), self.group)

    def lm_loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss with the head and cross-entropy fused: training never holds the full
        logits; under tensor parallelism each rank scores its slice and the loss is combined across them."""
        return kernels.linear_cross_entropy(h, self.weight, targets, group=self.group,
                                            vocab_start=self.vocab_start, fused=self.fused)


class PositionEmbedding(nn.Embedding):
    """Learned positions added to the token embeddings, then embedding dropout."""

    def __init__(self, p: ModelParams):
        super().__init__(p.seq_len, p.d_model)
        self.drop = nn.Dropout(p.dropout)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.drop(x + (self.weight[:x.shape[1]] if positions is None else self.weight[positions]))


def _initial(name: str, shape: tuple[int, ...], p: ModelParams, seed: int) -> torch.Tensor:
    """The initial full value of the parameter with this plain-GPT name: zero biases, unit LayerNorm
    gains, Normal(0, std) weights, output projections scaled by 1/sqrt(2 * n_layer) (GPT-2, Megatron)."""
    if name.endswith("bias"):
        return torch.zeros(shape)
    if name.split(".")[-2].startswith("ln"):
        return torch.ones(shape)
    std = p.std / math.sqrt(2 * p.n_layer) if name.endswith("proj.weight") else p.std
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return torch.normal(0.0, std, shape, generator=gen)


def init_parameters(modules, p: ModelParams, seed: int) -> None:
    """Initialise the parameters of (plain-GPT module name, module) pairs. Each full tensor is drawn
    from a generator seeded by (seed, its name) and this rank keeps its part, so one seed gives the
    same model at every (tp, pp) layout (at MT-NLG size the largest full tensor is ~5 GB, once)."""
    with torch.no_grad():
        for prefix, module in modules:
            for name, param in module.named_parameters(recurse=False):
                full = _initial(f"{prefix}.{name}" if prefix else name,
                                tp.full_shape(module, name, param.shape), p, seed)
                param.copy_(tp.local_part(module, name, full))


class GPT(nn.Module):
    """`group`: the tensor-parallel process group (None: one rank, plain layers). The pipeline
    (trainer/pipeline.py) is the same modules in a DeepSpeed PipelineModule."""

    def __init__(self, p: ModelParams, group=None, seed: int = 0):
        super().__init__()
        self.p, self.group = p, group
        self.wte = WordEmbedding(p, group)
        self.wpe = PositionEmbedding(p)
        self.blocks = nn.ModuleList(Block(p, group) for _ in range(p.n_layer))
        self.ln_f = LayerNorm(p.d_model, p.layernorm_eps, p.fused_kernels)
        init_parameters(self.named_modules(), p, seed)

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [batch, seq, d_model] after the last LayerNorm. `positions` and `mask`
        (see Attention) are for packed evaluation sequences; None: 0..seq-1, causal."""
        x = self.wpe(self.wte(tokens), positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] without targets; the mean next-token loss with them."""
        h = self.wte.enter_head(self.hidden(tokens))
        return self.wte.logits(h) if targets is None else self.wte.lm_loss(h, targets)
