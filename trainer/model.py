"""A plain GPT decoder (MT-NLG / GPT-3 shape). Fused kernels from kernels/ swap in through
`ModelParams.fused_kernels`; with it off, or without a GPU, every op is plain torch."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from trainer import tensor_parallel as tp
from trainer.config import ModelParams


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
        self.qkv = tp.ColumnParallelLinear(p.d_model, 3 * p.d_model, group)
        self.proj = tp.RowParallelLinear(p.d_model, p.d_model, group)
        self.drop = nn.Dropout(p.dropout)

    def forward(self, x):
        b, s, _ = x.shape
        hd = self.p.d_model // self.p.n_head
        q, k, v = self.qkv(x).view(b, s, self.heads, 3, hd).permute(3, 0, 2, 1, 4)
        if self.p.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 dropout_p=self.p.dropout if self.training else 0.0)
        else:
            scores = q @ k.transpose(-2, -1)
            probs = kernels.scaled_causal_softmax(scores, 1.0 / math.sqrt(q.shape[-1]), fused=self.p.fused_kernels)
            out = self.drop(probs) @ v
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

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """`group`: the tensor-parallel process group (None: one rank, plain layers)."""

    def __init__(self, p: ModelParams, group=None):
        super().__init__()
        self.p, self.group = p, group
        self.wte = tp.VocabParallelEmbedding(p.vocab_size, p.d_model, group)
        self.wpe = nn.Embedding(p.seq_len, p.d_model)
        self.drop = nn.Dropout(p.dropout)
        self.blocks = nn.ModuleList(Block(p, group) for _ in range(p.n_layer))
        self.ln_f = LayerNorm(p.d_model, p.layernorm_eps, p.fused_kernels)
        self.reset_parameters()

    def reset_parameters(self):
        """Normal(0, std) weights, zero biases; output projections scaled by 1/sqrt(2 * n_layer) (GPT-2, Megatron)."""
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif "ln" in name:
                nn.init.ones_(param)
            elif name.endswith("proj.weight"):
                nn.init.normal_(param, std=self.p.std / math.sqrt(2 * self.p.n_layer))
            else:
                nn.init.normal_(param, std=self.p.std)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden states [batch, seq, d_model] after the last LayerNorm."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] without targets; the mean next-token loss with them (the
        tied LM head and cross-entropy fused, so training never holds the full logits; under tensor
        parallelism each rank scores its vocabulary slice and the loss is combined across them)."""
        h = tp.copy_to_region(self.hidden(tokens), self.group)
        if targets is None:
            return tp.gather_from_region(h @ self.wte.weight.t(), self.group)
        return kernels.linear_cross_entropy(h, self.wte.weight, targets, group=self.group,
                                            vocab_start=self.wte.vocab_start, fused=self.p.fused_kernels)
