"""DVC: `dvc repro` runs the DAG, reruns only what changed, and agrees with a Prefect run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.project_copy import copy_project

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}


def dvc(repo: Path, *args: str) -> str:
    out = subprocess.run([str(BIN / "dvc"), *args], cwd=repo, env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def ran(log: str) -> list[str]:
    return re.findall(r"Running stage '(\w+)'", log)


def set_param(repo: Path, stage: str, key: str, value) -> None:
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    raw[stage][key] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def test_repro_then_noop_then_only_changed_stages(tmp_path):
    repo = copy_project(tmp_path)
    assert ran(dvc(repo, "repro")) == ["sample", "download", "extract", "filter", "dedup", "decontaminate", "tokenize", "train",
                                       "evaluate"]
    assert (repo / "data/extract/stats.json").is_file() and (repo / "dvc.lock").is_file()
    assert ran(dvc(repo, "repro")) == []
    assert "up to date" in dvc(repo, "status")

    set_param(repo, "tokenize", "seq_length", 64)  # the blend changes, the stages before it do not
    assert ran(dvc(repo, "repro")) == ["tokenize", "train", "evaluate"]

    set_param(repo, "decontaminate", "margin_chars", 100)
    # tokenize reruns only if the decontaminated shards came out different, train only if the blend did
    assert ran(dvc(repo, "repro")) in (["decontaminate"], ["decontaminate", "tokenize"],
                                       ["decontaminate", "tokenize", "train", "evaluate"])

    # drops documents: its output changes, and everything after it reruns, nothing before it
    # (a change at the root, e.g. download.n_files, is the same propagation one stage earlier)
    set_param(repo, "extract", "min_text_chars", 2000)
    assert ran(dvc(repo, "repro")) == ["extract", "filter", "dedup", "decontaminate", "tokenize", "train", "evaluate"]
    metrics = dvc(repo, "metrics", "show")
    assert "data/extract/stats.json" in metrics and "docs_out" in metrics
    assert "accuracy.boolq.zero-shot" in metrics  # the evaluation's Figure-3 numbers


def test_prefect_run_leaves_dvc_up_to_date(tmp_path):
    repo = copy_project(tmp_path)
    out = subprocess.run([sys.executable, "-m", "flows.pipeline", "params.yaml"], cwd=repo, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "recorded in dvc.lock: sample, download, extract, filter, dedup, decontaminate, tokenize, train, evaluate" \
        in out.stdout + out.stderr
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    assert ran(dvc(repo, "repro")) == []
