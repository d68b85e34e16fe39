"""Stage train end to end on a small blend: a pp = 2 run through torchrun, its checkpoint, metrics,
Hugging Face export and suite; a rerun is a no-op; bad inputs fail with the rank's (or the layout's) line."""
from __future__ import annotations

import csv
import json

import pytest

from tasks.core.config import parse_params
from tasks.core.errors import ConfigError, TrainingError, UnfinishedInput
from tasks.core.runner import run_stage
from tasks.validation import validate_stage
from tests.test_tokenize_stage import run as tokenize

TRAIN = {"model": {"n_layer": 2, "n_head": 2, "d_model": 32},
         "parallel": {"pp": 2, "micro_batch": 2, "global_batch": 4},
         "schedule": {"train_tokens": 0, "warmup_tokens": 64}, "checkpoint_every": 5}


def params(tmp_path, **train):
    return parse_params({"paths": {"data_dir": str(tmp_path / "data")}, "train": {**TRAIN, **train}})


@pytest.fixture(scope="module")
def blended(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("blend")
    tokenize(tmp, train_tokens=640, blend=[{"dataset": "web", "weight": 2}, {"dataset": "books", "weight": 1}])
    return tmp


def test_train_stage_trains_checkpoints_exports_and_validates(blended):
    p = params(blended)
    stats = run_stage("train", p)
    model = blended / "data/train/model"
    blend = json.loads((blended / "data/tokenize/blend/blend.json").read_text())
    assert stats["steps"] == blend["samples"] // 4 and stats["tokens"] == stats["steps"] * 4 * 16
    assert stats["layout"] == {"tp": 1, "pp": 2, "dp": 1}
    assert stats["model"]["seq_len"] == 16 and stats["model"]["vocab_size"] == 1024  # 300, padded
    assert stats["final_loss"] < stats["first_loss"]
    with (model / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, stats["steps"] + 1))
    assert {p.name for p in (model / "hf").iterdir()} == {"config.json", "model.safetensors", "tokenizer.json"}
    assert json.loads((model / "checkpoint/meta.json").read_text())["step"] == stats["steps"]
    report = validate_stage("train", p)
    assert report.success
    again = run_stage("train", p)
    assert again["passes"][0]["resumed"] == 1, "same blend and params: nothing retrained"


def test_a_layout_that_does_not_fit_fails_before_launching(blended):
    with pytest.raises(ConfigError, match="tp 3 does not divide n_head 2"):
        run_stage("train", params(blended, parallel={"tp": 3, "micro_batch": 2, "global_batch": 4}))


def test_a_rank_failure_fails_the_stage_with_the_ranks_line(blended):
    with pytest.raises(TrainingError, match=r"loss is (nan|inf) at step \d+ .*\(stage 'train', log: "):
        run_stage("train", params(blended, optim={"lr": 1.0e30, "grad_clip": 0.0}))


def test_train_needs_a_finished_blend(tmp_path):
    with pytest.raises(UnfinishedInput):
        run_stage("train", params(tmp_path))
