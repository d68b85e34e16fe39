"""Expectations on `train`, one row for the run: the final checkpoint loads (every tensor readable,
finite, and of the shape the model config gives), the logged losses are finite and metrics.csv has each
step from 1 to the checkpoint's once, the tokens seen are what the schedule asked for, and the Hugging
Face export loads as what it claims: its config.json is the checkpoint's model, its tensors are that
model's (names and shapes) and finite, its tokenizer.json is JSON."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd

from tasks.validation.runner import Batch

CHECKS = ["checkpoint_unloadable", "tensors_not_finite", "losses_not_finite", "steps_not_logged_once",
          "tokens_off_schedule", "export_invalid"]


def expectations() -> list:
    import great_expectations as gx
    return [gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0) for c in CHECKS]


def checkpoint_row(folder: Path) -> dict:
    import torch

    from trainer.checkpoint import Tensors, read_meta
    from trainer.config import ModelParams
    from trainer.model import GPT
    try:
        meta = read_meta(folder)
        tensors = Tensors(folder)
        expected = {k: v.shape for k, v in GPT(ModelParams(**meta["model"])).state_dict().items()}
        bad = sum(1 for k, shape in expected.items() for key in ("param", "exp_avg", "exp_avg_sq")
                  if tensors[f"{key}/{k}"].shape != shape)
        not_finite = sum(1 for f in tensors.files for k in f.keys() if not torch.isfinite(f.get_tensor(k)).all())
        return {"checkpoint_unloadable": int(bad > 0), "tensors_not_finite": not_finite, "meta": meta,
                "shapes": expected}
    except Exception:  # noqa: BLE001 - any failure to read it is what this expectation counts
        return {"checkpoint_unloadable": 1, "tensors_not_finite": 0, "meta": {}, "shapes": {}}


def export_row(hf: Path, meta: dict, shapes: dict) -> int:
    """How many of the export's files are not what the checkpoint's model gives (each one at most once).
    `shapes`: the model's tensor shapes by our names. Tensors are read one at a time."""
    import torch
    from safetensors import safe_open

    from trainer.config import ModelParams
    from trainer.export import hf_config, state_from_gpt2
    try:
        p = ModelParams(**meta["model"])
    except Exception:  # noqa: BLE001 - no checkpoint to compare with: the config and tensor checks below fail
        p = None
    bad = 0
    try:
        wanted = {k: v for k, v in hf_config(p).items() if k not in ("bos_token_id", "eos_token_id")}
        got = json.loads((hf / "config.json").read_text(encoding="utf-8"))
        bad += int({k: got.get(k) for k in wanted} != wanted)
    except Exception:  # noqa: BLE001 - unreadable or not JSON, or no checkpoint model
        bad += 1
    try:
        with safe_open(str(hf / "model.safetensors"), "pt") as f:
            # our names and shapes from the file's, mapped as a loader maps them (meta tensors: no data)
            ours = state_from_gpt2(lambda n: torch.empty(f.get_slice(n).get_shape(), device="meta"), p)
            finite = all(torch.isfinite(f.get_tensor(k)).all() for k in f.keys())
        bad += int({k: tuple(v.shape) for k, v in ours.items()} != {k: tuple(v) for k, v in shapes.items()}
                   or not finite)
    except Exception:  # noqa: BLE001 - a missing tensor, a shape that does not reshape, a damaged file
        bad += 1
    try:
        json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        bad += 1
    return bad


def batches(p, model_dir: Path):
    model_dir = Path(model_dir)
    row = checkpoint_row(model_dir / "checkpoint")
    meta, shapes = row.pop("meta"), row.pop("shapes")
    with (model_dir / "metrics.csv").open(newline="") as f:
        logged = list(csv.DictReader(f))
    losses = [float(r["loss"]) for r in logged]
    steps = [int(r["step"]) for r in logged]
    report = json.loads((model_dir / "train_report.json").read_text(encoding="utf-8"))
    wanted = report["train_tokens"]
    last_batch = report["model"]["seq_len"] * report["global_batch"]
    row.update(losses_not_finite=sum(1 for x in losses if not math.isfinite(x)) + int(not losses),
               # a resume drops the rows logged after its checkpoint: each step once, in order
               steps_not_logged_once=int(steps != list(range(1, int(meta.get("step", -1)) + 1))),
               # training stops at the first step that reaches the schedule's tokens
               tokens_off_schedule=int(not wanted <= meta.get("consumed_tokens", -1) < wanted + last_batch),
               export_invalid=export_row(model_dir / "hf", meta, shapes))
    yield Batch(pd.DataFrame([{"run": "train", **row}], columns=["run", *CHECKS]), [("run", 0, 1)])
