"""Expectations on `train`, one row for the run: the final checkpoint loads (every tensor readable,
finite, and of the shape the model config gives), the logged losses are finite, the tokens seen are
what the schedule asked for, and the Hugging Face export is complete."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd

from tasks.validation.runner import Batch

CHECKS = ["checkpoint_unloadable", "tensors_not_finite", "losses_not_finite", "tokens_off_schedule",
          "export_files_missing"]


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
        return {"checkpoint_unloadable": int(bad > 0), "tensors_not_finite": not_finite, "meta": meta}
    except Exception:  # noqa: BLE001 - any failure to read it is what this expectation counts
        return {"checkpoint_unloadable": 1, "tensors_not_finite": 0, "meta": {}}


def batches(p, model_dir: Path):
    model_dir = Path(model_dir)
    row = checkpoint_row(model_dir / "checkpoint")
    meta = row.pop("meta")
    with (model_dir / "metrics.csv").open(newline="") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    report = json.loads((model_dir / "train_report.json").read_text(encoding="utf-8"))
    wanted = report["train_tokens"]
    last_batch = report["model"]["seq_len"] * report["global_batch"]
    row.update(losses_not_finite=sum(1 for x in losses if not math.isfinite(x)) + int(not losses),
               # training stops at the first step that reaches the schedule's tokens
               tokens_off_schedule=int(not wanted <= meta.get("consumed_tokens", -1) < wanted + last_batch),
               export_files_missing=sum(1 for f in ("config.json", "model.safetensors", "tokenizer.json")
                                        if not (model_dir / "hf" / f).is_file()))
    yield Batch(pd.DataFrame([{"run": "train", **row}], columns=["run", *CHECKS]), [("run", 0, 1)])
