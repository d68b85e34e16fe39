"""Size a run before renting the machines: parameters, and memory per GPU for a layout.

    python -m trainer.size mt-nlg-530b      # or gpt-350m

Per GPU (bf16 training with DeepSpeed's fp32 gradient accumulation and ZeRO-1):
  weights bf16 2 B + gradients fp32 4 B per local parameter, fp32 master + Adam moments 12 B per
  local parameter / dp; activations with full recomputation: each layer's input (2 s b h bytes)
  for every micro-batch in flight (at most pp on the first stage under 1F1B), plus one layer's
  working set while it is recomputed, s b h (10 + 24 / tp) bytes (Korthikanti et al. 2022, without the
  5 a s / h attention-score term: scaled_dot_product_attention never materialises the scores).
"""
from __future__ import annotations

import math
import sys

from trainer.config import ArchParams, ModelParams, OptimParams, ParallelParams, ScheduleParams, padded_vocab

GIB = 2**30

PROFILES = {
    # Smith et al. 2022: 105 layers, hidden 20480, 128 heads, sequence 2048, tp 8 x pp 35 on 280 DGX A100
    # (2240 GPUs: dp 8), batch 1920 ramped from 32 by 32 over 12B tokens, lr 5e-5, 1B warmup tokens, cosine
    # to 10% over 340B tokens (as we read the paper), 270B tokens trained
    "mt-nlg-530b": dict(arch=ArchParams(n_layer=105, n_head=128, d_model=20480), seq_len=2048, vocab=50257,
                        parallel=ParallelParams(tp=8, pp=35, dp=8, micro_batch=1, global_batch=1920),
                        optim=OptimParams(lr=5e-5, dtype="bf16"),
                        schedule=ScheduleParams(train_tokens=270 * 10**9, warmup_tokens=10**9,
                                                decay_tokens=340 * 10**9, rampup_start=32,
                                                rampup_increment=32, rampup_tokens=12 * 10**9)),
    # a GPT-2 medium-sized model on one GPU (the engine's MFU benchmark, issue #12)
    "gpt-350m": dict(arch=ArchParams(n_layer=24, n_head=16, d_model=1024), seq_len=2048, vocab=50257,
                     parallel=ParallelParams(tp=1, pp=1, dp=1, micro_batch=8, global_batch=256),
                     optim=OptimParams(lr=3e-4, dtype="bf16"),
                     schedule=ScheduleParams(train_tokens=10 * 10**9, warmup_tokens=10**8)),
}


def model_of(profile: dict) -> ModelParams:
    par = profile["parallel"]
    return ModelParams(**profile["arch"].model_dump(), seq_len=profile["seq_len"],
                       vocab_size=padded_vocab(profile["vocab"], par.tp))


def parameters(m: ModelParams) -> int:
    """Every parameter once (the tied embedding counted once)."""
    h = m.d_model
    return m.vocab_size * h + m.seq_len * h + 2 * h + m.n_layer * (12 * h * h + 13 * h)


def size(m: ModelParams, par: ParallelParams) -> dict:
    h, s, b = m.d_model, m.seq_len, par.micro_batch
    layers_per_stage = math.ceil(m.n_layer / par.pp)
    # the busiest stage: its blocks plus the word and position embeddings (first stage). Split by tp:
    # the blocks' matrices and column biases, the vocabulary; whole on every tp rank: LayerNorms, the
    # row-parallel biases, the position embedding
    split = layers_per_stage * (12 * h * h + 5 * h) + m.vocab_size * h
    whole = layers_per_stage * 8 * h + m.seq_len * h
    local = split / par.tp + whole
    in_flight = min(par.pp, par.micro_batches)
    # recomputed layer's working set: s b h (10 + 24 / tp) bytes (attention scores never materialised: SDPA)
    activations = 2 * s * b * h * layers_per_stage * in_flight + s * b * h * (10 + 24 / par.tp)
    states = local * (2 + 4) + local * 12 / par.dp
    return {"parameters": parameters(m), "parameters_per_gpu": int(local), "gpus": par.world_size,
            "weights_and_grads_gib": local * 6 / GIB, "optimizer_gib": local * 12 / par.dp / GIB,
            "activations_gib": activations / GIB, "total_gib": (states + activations) / GIB}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in PROFILES:
        print(f"usage: python -m trainer.size {{{'|'.join(PROFILES)}}}", file=sys.stderr)
        return 2
    profile = PROFILES[argv[0]]
    m, par = model_of(profile), profile["parallel"]
    r = size(m, par)
    print(f"{argv[0]}: {r['parameters'] / 1e9:.1f}B parameters; {m.n_layer} layers x {m.d_model} hidden x "
          f"{m.n_head} heads, sequence {m.seq_len}, vocabulary {m.vocab_size}")
    print(f"layout tp {par.tp} x pp {par.pp} x dp {par.dp} = {r['gpus']} GPUs, micro-batch {par.micro_batch}, "
          f"global batch {par.global_batch} ({par.micro_batches} micro-batches per replica)")
    print(f"per GPU (busiest stage): {r['parameters_per_gpu'] / 1e9:.2f}B parameters; weights + grads "
          f"{r['weights_and_grads_gib']:.1f} GiB, optimizer {r['optimizer_gib']:.1f} GiB, activations "
          f"{r['activations_gib']:.1f} GiB (full recomputation): {r['total_gib']:.1f} GiB of an 80 GiB GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
