"""A training run: the recipe's schedules over the data, periodic atomic checkpoints, resume from the
latest one (at any layout), and per-step metrics (CSV for `dvc plots`, a progress bar on rank 0)."""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from pathlib import Path

from tasks.core.errors import ConfigError, TrainingError
from trainer import checkpoint, rng, schedule
from trainer.config import ModelParams, TrainParams, recipe_model
from trainer.data import Samples, check_fits, replica_batch

FIELDS = ["step", "loss", "lr", "global_batch", "tokens", "tokens_per_s", "tflops_per_device", "mfu"]


def model_flops(model: ModelParams, sequences: int) -> float:
    """Megatron's count of a step's model FLOPs (forward + backward, no recomputation):
    72 B s l h^2 (1 + s / 6h + V / 12 l h)."""
    b, s, l, h, v = sequences, model.seq_len, model.n_layer, model.d_model, model.vocab_size
    return 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def write_progress(path: Path, row: dict, train_tokens: int, since: tuple[int, float]) -> None:
    """Rank 0's progress.json (the last step's numbers, the target, the tokens and seconds this launch
    has run since `since` = (tokens, perf_counter) at its start, for an ETA), replaced atomically each
    step, for watchers such as the Prefect flow's progress artifact."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**row, "train_tokens": train_tokens, "run_tokens": row["tokens"] - since[0],
                               "run_seconds": round(time.perf_counter() - since[1], 3)}))
    os.replace(tmp, path)


class MetricsLog:
    """Rank 0's metrics.csv; on resume the rows after the checkpoint's step are dropped (they are redone)."""

    def __init__(self, path: Path, resumed_step: int):
        self.path = path
        rows = []
        if path.is_file() and resumed_step:
            with path.open(newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resumed_step]
        tmp = path.with_name(path.name + ".tmp")  # a kill mid-rewrite must not lose the history
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)

    def add(self, row: dict) -> None:
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, FIELDS).writerow(row)


def train(cfg: TrainParams, samples: Samples, out: Path, init_from: Path | None = None, run_id: str = "") -> dict:
    """Train until schedule.train_tokens are consumed; every rank calls this under torchrun/deepspeed.
    Resumes from the latest checkpoint in `out`, else from `init_from` (a checkpoint folder written at
    any layout), else starts fresh. Checkpoints record `run_id`, what makes this run this run (empty: the
    digest of the model, optimizer, schedule and seed), so two runs' step-N are told apart."""
    from trainer.engine import Engine
    out, seq = Path(out), cfg.model.seq_len
    check_fits(samples, seq, cfg.model.vocab_size)
    run_id = run_id or recipe_digest(cfg)  # of the recipe as given: train_tokens 0 is resolved below
    ckpt_dir = out / "checkpoints"
    own = checkpoint.latest(ckpt_dir)
    found = own or init_from
    schedule.check(cfg.schedule, cfg.parallel)  # first: a bad ramp divided by zero in within_data
    if own is None and not schedule.within_data(cfg.schedule, cfg.parallel, seq, len(samples)).train_tokens:
        raise ConfigError(f"the data has {len(samples)} samples, fewer than one global batch "
                          f"({schedule.global_batch(0, cfg.schedule, cfg.parallel, seq)})")
    engine = Engine.start(cfg.model, cfg.parallel, cfg.optim, cfg.seed)
    # dropout's streams (trainer/rng.py); a resume at the same layout restores their exact state
    rng.seed_streams(cfg.seed, engine.coord)
    position = {"consumed_samples": 0, "consumed_tokens": 0}
    step = 0
    if found is not None:
        meta = checkpoint.load(engine, found, own=own is not None)
        step, position = meta["step"], {k: meta[k] for k in position}
    # train_tokens 0, or a budget whose last batch would run past the data it was built for: the whole
    # batches left from here (from the resume position: a global batch changed on resume makes whole
    # batches of what is left, where whole batches of all the samples at the new batch could end past it)
    cfg = cfg.model_copy(update={"schedule": schedule.within_data(cfg.schedule, cfg.parallel, seq, len(samples),
                                                                  position["consumed_samples"])})
    leader = engine.rank == 0
    log = MetricsLog(out / "metrics.csv", step) if leader else None
    bar = _progress(cfg, position["consumed_tokens"]) if leader else None
    world = cfg.parallel.world_size
    since = (position["consumed_tokens"], time.perf_counter())
    try:
        while position["consumed_tokens"] < cfg.schedule.train_tokens:
            rows = schedule.global_batch(position["consumed_samples"], cfg.schedule, cfg.parallel, seq)
            start = position["consumed_samples"]
            if start + rows > len(samples):
                raise ConfigError(f"the data has {len(samples)} samples but step {step + 1} needs samples up to "
                                  f"{start + rows}: train_tokens {cfg.schedule.train_tokens} needs a larger blend")
            lr = schedule.learning_rate(position["consumed_tokens"], cfg.schedule, cfg.optim)
            engine.set_global_batch(rows)
            engine.set_lr(lr)
            t0 = time.perf_counter()
            loss = engine.train_step(replica_batch(samples, start, rows, engine.coord.data, cfg.parallel.dp))
            seconds = time.perf_counter() - t0
            if not math.isfinite(loss) and cfg.optim.dtype != "fp16":
                raise TrainingError(f"loss is {loss} at step {step + 1} (no loss scaler to skip it in "
                                    f"{cfg.optim.dtype}): stopping rather than training on garbage")
            # fp16: DeepSpeed's dynamic loss scaler has skipped this step's update and lowered the scale;
            # the data position moves on (as Megatron), and the row records the non-finite loss; so does the
            # learning rate, which follows the tokens consumed: Megatron-DeepSpeed's token-based schedule (MT-NLG's
            # --lr-warmup-tokens / --lr-decay-tokens) reads consumed_train_tokens, which counts every iteration,
            # skipped or not (Megatron-LM's iteration-based one counts applied updates only)
            step += 1
            position = {"consumed_samples": start + rows, "consumed_tokens": position["consumed_tokens"] + rows * seq}
            if leader:
                tflops = model_flops(engine.model, rows) / seconds / world / 1e12
                row = {"step": step, "loss": repr(loss), "lr": f"{lr:.6g}", "global_batch": rows,
                       "tokens": position["consumed_tokens"], "tokens_per_s": f"{rows * seq / seconds:.1f}",
                       "tflops_per_device": f"{tflops:.4f}",
                       "mfu": f"{tflops / cfg.peak_tflops:.4f}" if cfg.peak_tflops else ""}
                log.add(row)
                write_progress(out / "progress.json", row, cfg.schedule.train_tokens, since)
                bar.update(rows * seq)
                bar.set_postfix(step=step, loss=f"{loss:.4f}", refresh=False)
            done = position["consumed_tokens"] >= cfg.schedule.train_tokens
            if step % cfg.checkpoint_every == 0 or done:
                # the tokens the schedule trains to, recorded: a finished run resumed with another global batch
                # (train_tokens 0: whole batches of the blend) trains no step, and its target stays this one
                checkpoint.save(engine, ckpt_dir, step, {**position, "train_tokens": cfg.schedule.train_tokens},
                                run_id)
                if leader:
                    checkpoint.prune(ckpt_dir, cfg.keep_checkpoints)
    finally:
        if bar is not None:
            bar.close()
    engine.close()
    return {"step": step, **position}


def recipe_digest(cfg: TrainParams) -> str:
    """The digest of what makes a run's weights: model, optimizer, schedule, seed (not the layout, the
    checkpoint cadence or the MFU peak, which a resume may change)."""
    import hashlib
    import json
    recipe = {k: getattr(cfg, k).model_dump(mode="json") for k in ("optim", "schedule")}
    recipe["model"] = recipe_model(cfg.model).model_dump(mode="json")
    return hashlib.sha256(json.dumps([recipe, cfg.seed], sort_keys=True).encode()).hexdigest()


def _progress(cfg: TrainParams, done: int):
    from tqdm import tqdm
    return tqdm(total=cfg.schedule.train_tokens, initial=done, unit="tok", unit_scale=True, file=sys.stderr,
                desc="train", dynamic_ncols=True, mininterval=1.0)
