"""Parity of the engine with a single process: the same seed, data and recipe trained at a (tp, pp, dp)
layout under torchrun and in the plain PyTorch loop must give the same losses step by step.

    python -m trainer.parity run.json     # one rank of a torchrun launch: trains, rank 0 writes losses

`launch` starts it under torchrun on 127.0.0.1 (gloo on CPU); `plain_losses` runs the reference loop.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
from pydantic import Field

from tasks.core.config import Strict
from trainer.config import ModelParams, OptimParams, ParallelParams


class ParityRun(Strict):
    model: ModelParams
    parallel: ParallelParams = ParallelParams()
    optim: OptimParams = OptimParams()
    seed: int = 0
    steps: int = Field(10, ge=1)
    out: str = "parity.json"


def batches(run: ParityRun) -> torch.Tensor:
    """[steps, global_batch, seq + 1] random tokens, the same for every layout."""
    gen = torch.Generator().manual_seed(run.seed + 1)
    shape = (run.steps, run.parallel.global_batch, run.model.seq_len + 1)
    return torch.randint(0, run.model.vocab_size, shape, generator=gen)


def plain_losses(run: ParityRun) -> list[float]:
    from trainer.plain_loop import PlainLoop
    loop = PlainLoop(run.model, run.optim, run.parallel.micro_batch, run.seed)
    return [loop.train_step(batch) for batch in batches(run)]


def engine_losses(run: ParityRun) -> tuple[list[float], list[float | None]]:
    """The losses and the gradient norms before clipping, step by step (a parameter counted twice or
    left out of the norm shows there at once, where it moves the loss by ~1e-5 only)."""
    from trainer import rng
    from trainer.engine import Engine
    engine = Engine.start(run.model, run.parallel, run.optim, run.seed)
    rng.seed_streams(run.seed, engine.coord)  # as the training loop: tensor-parallel dropout draws from them
    losses, norms = [], []
    for batch in batches(run):
        losses.append(engine.train_step(engine.replica_rows(batch)))
        norms.append(engine.grad_norm())
    engine.close()
    return losses, norms


def worst(diffs) -> float:
    """The largest difference, inf where one is NaN: max() keeps a NaN only when it comes first, so a run
    that diverged after its first step compared as equal."""
    diffs = list(diffs)
    return math.inf if any(math.isnan(d) for d in diffs) else max(diffs)


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return worst(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def launch(run: ParityRun, workdir: Path, timeout: float = 900) -> dict:
    """Train `run` on tp x pp x dp local processes through torchrun; returns rank 0's result
    ({"losses": [...]}) or raises RuntimeError with the ranks' first error line."""
    from trainer import launch as launcher
    workdir.mkdir(parents=True, exist_ok=True)
    run = run.model_copy(update={"out": str(workdir / "result.json")})
    cfg = workdir / "run.json"
    cfg.write_text(run.model_dump_json(), encoding="utf-8")
    launcher.run("trainer.parity", cfg, run.parallel.world_size, workdir / "launch.log", timeout)
    return json.loads(Path(run.out).read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    from tasks.core.errors import describe
    try:
        run = ParityRun.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
        losses, norms = engine_losses(run)
    except Exception as e:  # noqa: BLE001 - one line and the exit code, as every entry point
        code, line = describe(e)
        print(line, file=sys.stderr)
        return code
    if int(os.environ.get("RANK", "0")) == 0:
        Path(run.out).write_text(json.dumps({"losses": losses, "grad_norms": norms}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
