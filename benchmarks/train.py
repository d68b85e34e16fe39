"""3D-parallel engine benchmark (CPU).

    python -m benchmarks.train [--steps 10] [--repeats 5]

(a) parity: a tiny GPT trained `--steps` optimizer steps at (tp, pp, dp) = (2, 2, 2) on 8 local gloo
    ranks (torchrun) and in the single-process plain PyTorch loop, same seed, data and recipe
    (AdamW, clipping on); parity_max_rel_diff is the largest relative loss difference over the steps.
(b) speed: tokens/s of the engine at tp = pp = dp = 1 (DeepSpeed pipeline engine, 1F1B; ZeRO stage 0, as
    the engine runs a single fp32 replica) and
    of the plain loop on the same model and batch, in one process, one thread, interleaved repeats;
    cpu_speed_ratio_vs_plain = median engine tokens/s / median plain tokens/s.
The last line is `parity_max_rel_diff=<d> cpu_speed_ratio_vs_plain=<r>`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainer.config import ModelParams, OptimParams, ParallelParams
from trainer.launch import free_port
from trainer.parity import ParityRun, batches, launch, max_rel_diff, plain_losses

PARITY_MODEL = ModelParams(n_layer=4, n_head=4, d_model=64, vocab_size=256, seq_len=32, fused_kernels=False)
SPEED_MODEL = ModelParams(n_layer=4, n_head=8, d_model=256, vocab_size=4096, seq_len=128, fused_kernels=False)


def parity(steps: int) -> float:
    run = ParityRun(model=PARITY_MODEL, parallel=ParallelParams(tp=2, pp=2, dp=2, micro_batch=2, global_batch=16),
                    optim=OptimParams(lr=3e-3, grad_clip=0.5), steps=steps)
    reference = plain_losses(run)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        losses = launch(run, Path(tmp))["losses"]
        took = time.perf_counter() - t0
    print(f"{'step':>4}{'plain loop':>14}{'(2,2,2) engine':>16}")
    for i, (a, b) in enumerate(zip(reference, losses)):
        print(f"{i:>4}{a:>14.7f}{b:>16.7f}")
    print(f"8-rank launch and {steps} steps: {took:.1f} s")
    return max_rel_diff(losses, reference)


def speed(steps: int, repeats: int) -> float:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    par = ParallelParams(micro_batch=4, global_batch=16)
    run = ParityRun(model=SPEED_MODEL, parallel=par, steps=steps)
    from trainer.engine import Engine
    from trainer.plain_loop import PlainLoop
    data = batches(run)
    engine = Engine.start(SPEED_MODEL, par, run.optim, seed=0)
    plain = PlainLoop(SPEED_MODEL, run.optim, par.micro_batch, seed=0)
    engine.train_step(data[0])  # warm-up: first-step allocations, optimizer state
    plain.train_step(data[0])
    tokens = steps * par.global_batch * SPEED_MODEL.seq_len
    rates = {"engine": [], "plain": []}
    for _ in range(repeats):
        for label, step in (("engine", engine.train_step), ("plain", plain.train_step)):
            t0 = time.perf_counter()
            for batch in data:
                step(batch)
            rates[label].append(tokens / (time.perf_counter() - t0))
    for label, values in rates.items():
        print(f"{label:>6} tokens/s: " + " ".join(f"{v:,.0f}" for v in values)
              + f"  (median {statistics.median(values):,.0f})")
    return statistics.median(rates["engine"]) / statistics.median(rates["plain"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    diff = parity(args.steps)
    ratio = speed(max(2, args.steps // 4), args.repeats)
    print(f"parity_max_rel_diff={diff:.3g} cpu_speed_ratio_vs_plain={ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
