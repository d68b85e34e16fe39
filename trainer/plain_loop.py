"""The minimal single-process PyTorch training loop of the same GPT: what the engine must match
(parity) and what its speed is measured against (benchmarks/train.py)."""
from __future__ import annotations

import torch

from trainer.config import ModelParams, OptimParams, padded_vocab
from trainer.engine import param_groups
from trainer.model import GPT


class PlainLoop:
    def __init__(self, model: ModelParams, opt: OptimParams, micro_batch: int, seed: int = 0):
        # the engine's model: the vocabulary padded as at any tp up to 8 (trainer.config.padded_vocab)
        self.gpt = GPT(model.model_copy(update={"vocab_size": padded_vocab(model.vocab_size, 1)}), seed=seed)
        self.opt, self.micro_batch = opt, micro_batch
        self.grad_norms: list[float] = []  # before clipping, one per step
        self.optimizer = torch.optim.AdamW(param_groups(self.gpt, opt.weight_decay), lr=opt.lr,
                                           betas=(opt.beta1, opt.beta2), eps=opt.eps)

    def train_step(self, batch: torch.Tensor) -> float:
        """One optimizer step over a global batch [rows, seq + 1], accumulated micro-batch by
        micro-batch; returns the mean loss."""
        self.optimizer.zero_grad(set_to_none=True)
        parts = batch.split(self.micro_batch)
        total = 0.0
        for mb in parts:
            loss = self.gpt(mb[:, :-1], mb[:, 1:]) / len(parts)
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(self.gpt.parameters(), self.opt.grad_clip or float("inf"))
        self.grad_norms.append(float(norm))
        self.optimizer.step()
        return total
