"""DVC: `dvc repro` runs the DAG and reruns only what changed (that a Prefect run leaves DVC up to date
is checked in test_prefect, on the pipeline run against a server)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tasks.core.registry import PIPELINE
from tests.conftest import BENCHMARKS, BIN, REPO
from tests.project_copy import copy_project

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
    repo = copy_project(tmp_path / "project")
    bench = tmp_path / "benchmarks"  # a copy, to edit a task file at the end
    shutil.copytree(BENCHMARKS, bench)
    set_param(repo, "paths", "benchmarks_dir", str(bench))
    assert ran(dvc(repo, "repro")) == ["sample", "download", "extract", "filter", "dedup", "decontaminate", "tokenize", "train",
                                       "evaluate"]
    assert (repo / "data/extract/stats.json").is_file() and (repo / "dvc.lock").is_file()
    assert ran(dvc(repo, "repro")) == []
    assert "up to date" in dvc(repo, "status")

    # a changed parameter reruns its stage; the stages after it rerun only if its output changed, and
    # on the sample no document is split into more than 10 pieces: the same shards, byte for byte
    set_param(repo, "decontaminate", "max_pieces", 50)
    assert ran(dvc(repo, "repro")) == ["decontaminate"]

    # joins more near-duplicates (1 -> 5 removed on this sample): its output changes, and everything after
    # it reruns, nothing before it (a change at the root, e.g. download.n_files, or later, e.g.
    # tokenize.seq_length, is the same propagation)
    first = yaml.safe_load((repo / "params.yaml").read_text())["dedup"]["threshold"]
    set_param(repo, "dedup", "threshold", 0.5)
    assert ran(dvc(repo, "repro")) == ["dedup", "decontaminate", "tokenize", "train", "evaluate"]
    metrics = dvc(repo, "metrics", "show")
    assert "data/extract/stats.json" in metrics and "data/dedup/stats.json" in metrics and "docs_out" in metrics
    assert "accuracy.boolq.zero-shot" in metrics  # the evaluation's Figure-3 numbers

    # back to the first threshold with the Data Docs gone: every stage comes back from DVC's run cache,
    # and each stage's Data Docs site with it
    shutil.rmtree(repo / "data/docs")
    set_param(repo, "dedup", "threshold", first)
    log = dvc(repo, "repro")
    assert ran(log) == [] and "Stage 'dedup' is cached - skipping run" in log, log
    for stage in ("download", "dedup", "evaluate"):
        assert (repo / f"data/docs/{stage}/index.html").is_file() and (repo / f"data/docs/{stage}/summary.json").is_file()

    # an edited suite: every validated stage is out of date, as its key says (DVC said up to date, and the
    # outputs stood unchecked by the new suite)
    suite = repo / "tasks/validation/dedup.py"
    text = suite.read_text()
    suite.write_text(text + "\nRECHECKED = True\n")
    status = json.loads(dvc(repo, "status", "--json").strip().splitlines()[-1])
    assert sorted(status) == sorted(set(PIPELINE) - {"sample"}), status
    suite.write_text(text)

    # an edited task file: the stages that read the task files are out of date (DVC said up to date)
    boolq = bench / "boolq" / "dev.jsonl"
    boolq.write_text(boolq.read_text(encoding="utf-8").replace("\n", " \n", 1), encoding="utf-8")
    status = json.loads(dvc(repo, "status", "--json").strip().splitlines()[-1])
    assert sorted(status) == ["decontaminate", "evaluate", "sample"], status


def small_dvc_project(root: Path, git: bool) -> Path:
    """The repo's params.yaml and a one-stage dvc.yaml whose output was never written."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    (root / "dvc.yaml").write_text("stages:\n  sample:\n    cmd: python -m tasks sample\n    outs:\n      - data/sample/corpus\n")
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=root, env=ENV, check=True)
    else:  # as unpacked from an archive of the project: .dvc/ without .git/
        (root / ".dvc").mkdir()
        (root / ".dvc" / "config").write_text("[core]\n    analytics = false\n")
    return root


def test_a_run_outside_git_is_not_recorded_and_says_why(tmp_path, monkeypatch):
    # `dvc commit` needs a git work tree: the run used to end in exit 1 with "dvc commit failed:" and
    # no cause (--quiet hid DVC's message), after every stage had finished
    from flows.dvc_sync import record_in_dvc
    from tasks.core.config import load_params
    monkeypatch.chdir(small_dvc_project(tmp_path / "unpacked", git=False))
    said = record_in_dvc(["sample"], load_params("params.yaml"))
    assert said.startswith("not recorded in dvc.lock: ") and "is not in a git repository" in said, said
    (tmp_path / "unpacked" / ".dvc" / "config").write_text("[core]\n    no_scm = True\n")  # dvc init --no-scm
    with pytest.raises(RuntimeError, match="output 'data/sample/corpus' does not exist"):  # DVC was asked
        record_in_dvc(["sample"], load_params("params.yaml"))


def test_a_failed_dvc_commit_names_dvcs_cause(tmp_path, monkeypatch):
    from flows.dvc_sync import record_in_dvc
    from tasks.core.config import load_params
    monkeypatch.chdir(small_dvc_project(tmp_path / "repo", git=True))
    with pytest.raises(RuntimeError) as e:
        record_in_dvc(["sample"], load_params("params.yaml"))
    assert str(e.value) == "dvc commit failed: failed to commit sample - output 'data/sample/corpus' does not exist"


def test_a_data_dir_other_than_dvcs_is_not_recorded_and_dvc_repro_refuses_it(tmp_path, monkeypatch):
    """dvc.yaml's stages read and write data/: with params.yaml's data_dir elsewhere, `make run` ran every
    stage and then failed in `dvc commit` ("output 'data/sample/corpus' does not exist"), and `dvc repro`
    ran a stage before DVC failed on its output."""
    import sys

    from flows.dvc_sync import record_in_dvc
    from tasks.core.config import load_params
    root = small_dvc_project(tmp_path / "repo", git=True)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["paths"]["data_dir"] = str(tmp_path / "big-disk")
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(root)
    why = f"paths.data_dir is {tmp_path / 'big-disk'}, and dvc.yaml's stages read and write {root / 'data'}"
    assert record_in_dvc(["sample"], load_params("params.yaml")) == f"not recorded in dvc.lock: {why}"  # DVC not asked

    def under_dvc_repro() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tasks", "sample"], cwd=root, capture_output=True, text=True,
                              env={**ENV, "DVC_STAGE": "sample", "PYTHONPATH": str(REPO)})

    out = under_dvc_repro()
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [f"configuration error: {why}: `dvc repro` needs data_dir: data, inside the "
                                       f"repository (`make run` takes any data_dir, and does not record it in dvc.lock)"]
    assert not (tmp_path / "big-disk").exists()
    # data/ a symlink to that disk, data_dir: data: DVC refuses outputs behind it ("is outside of git repository")
    (tmp_path / "big-disk").mkdir()
    (root / "data").symlink_to(tmp_path / "big-disk")
    raw["paths"]["data_dir"] = "data"
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    why = f"{root / 'data'} leads out of the repository (to {tmp_path / 'big-disk'}), and DVC records nothing outside it"
    assert record_in_dvc(["sample"], load_params("params.yaml")) == f"not recorded in dvc.lock: {why}"
    out = under_dvc_repro()
    assert out.returncode == 2 and out.stderr.startswith(f"configuration error: {why}: "), out.stderr
    assert not any((tmp_path / "big-disk").iterdir())


def test_a_stage_whose_code_changed_while_the_run_was_under_way_is_not_recorded(tmp_path, monkeypatch,
                                                                                copied_sources):
    """Its outputs are what the code loaded at the run's start made; recorded against the edited code,
    `dvc repro` would take them as up to date."""
    from flows.dvc_sync import record_in_dvc
    from tasks.core import registry, source
    from tasks.core.config import load_params
    monkeypatch.chdir(small_dvc_project(tmp_path / "repo", git=True))
    source.loaded_code_digest(registry.stage("sample").code)  # as the pipeline run starts
    stage_py = copied_sources / "tasks" / "sample" / "stage.py"
    stage_py.write_text(stage_py.read_text() + "\nCHANGED = 1\n")
    # DVC is not asked (it would fail: this project's sample never ran)
    assert record_in_dvc(["sample"], load_params("params.yaml")) == (
        "not recorded in dvc.lock: the code of sample changed while the run was under way (the outputs are the "
        "old code's; the next run redoes them)")


def test_dvc_repro_beside_a_running_stage_stops_before_deleting_its_input(tmp_path, monkeypatch):
    """DVC deletes a stage's outputs before its command runs: a `dvc repro -f -s tokenize` beside a running
    train took the tokenizer from under it, and only then did the stage's own lock refuse. A running stage
    now holds DVC's repository lock (shared), which DVC takes before it deletes anything."""
    import zc.lockfile

    from tasks.core.config import load_params
    from tasks.core.errors import StageBusy
    from tasks.core.runner import stage_lock
    root = small_dvc_project(tmp_path / "repo", git=True)
    monkeypatch.chdir(root)
    corpus = root / "data/sample/corpus"
    corpus.mkdir(parents=True)
    (corpus / "part-0.warc.gz").write_bytes(b"read by download")
    p = load_params("params.yaml")
    with stage_lock(p, "download"):  # download reads sample's corpus
        out = subprocess.run([str(BIN / "dvc"), "repro", "-f", "-s", "sample"], cwd=root, env=ENV,
                             capture_output=True, text=True)
        assert out.returncode != 0 and "Unable to acquire lock" in out.stderr + out.stdout, out.stdout + out.stderr
        assert (corpus / "part-0.warc.gz").read_bytes() == b"read by download"
        with stage_lock(p, "tokenize"):  # stages share it: another stage starts beside it
            pass
        # a pipeline run that ends meanwhile (another stage of data/, a train run can hold it for days) is not
        # recorded, and says so: its `dvc commit` failed the whole run ("Unable to acquire lock")
        from flows.dvc_sync import record_in_dvc
        assert record_in_dvc(["sample"], p).startswith(f"not recorded in dvc.lock: a stage running in {p.paths.data_dir} "
                                                       f"holds DVC's lock")
    # the other way round: a stage does not start while a DVC command holds it
    held = zc.lockfile.LockFile(str(root / ".dvc/tmp/lock"))
    try:
        with pytest.raises(StageBusy, match=r"^a DVC command is running in .*\(it holds \.dvc/tmp/lock\): wait for it"):
            with stage_lock(p, "download"):
                pass
        other = p.model_copy(update={"paths": p.paths.model_copy(update={"data_dir": str(tmp_path / "elsewhere")})})
        with stage_lock(other, "download"):  # outputs DVC does not track: DVC's lock is not theirs to wait for
            pass
    finally:
        held.close()
