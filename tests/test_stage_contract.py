"""The stage contract: kill -9 at any moment, rerun -> only missing shards redone, same bytes."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tasks.core.config import parse_params
from tasks.core.errors import UnfinishedInput
from tasks.download.http_fetch import gzip_complete
from tasks.core.runner import run_stage
from tests.conftest import REPO, copy_stages, small_raw


def digest(stage_dir: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((stage_dir / "shards").iterdir())}


def write_params(root: Path, **over) -> Path:
    raw = small_raw(root / "data", sample={"n_warc_files": 6, "pages_per_warc": 80}, download={"n_files": 6}, **over)
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    return root / "params.yaml"


def cli(root: Path, stage: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tasks", stage], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def assert_only_complete_outputs(stage_dir: Path) -> None:
    """Whatever a kill left behind, every visible output is whole (temp files are hidden)."""
    for f in (stage_dir / "shards").iterdir():
        if f.name.startswith(".tmp-"):
            continue
        if f.suffix == ".parquet":
            pq.read_table(f)
        else:
            assert gzip_complete(f), f


def markers(stage_dir: Path) -> int:
    return len(list((stage_dir / "completions").glob("*.json"))) if (stage_dir / "completions").exists() else 0


def test_kill_9_then_resume_is_byte_identical(tmp_path):
    ref = tmp_path / "ref"
    ref.mkdir()
    ref_params = parse_params(yaml.safe_load(write_params(ref).read_text()))
    for stage in ("sample", "download", "extract"):  # the uninterrupted reference, in this process
        run_stage(stage, ref_params)
    reference = {s: digest(ref / "data" / s) for s in ("download", "extract")}

    work = tmp_path / "work"
    work.mkdir()
    run_stage("sample", parse_params(yaml.safe_load(write_params(work).read_text())))
    partial_kills = 0
    for stage in ("download", "extract"):
        stage_dir = work / "data" / stage
        for target in (0, 1, 3, 5):  # kill before any shard finished, then after 1, 3 and 5 markers
            proc = cli(work, stage)
            while proc.poll() is None and markers(stage_dir) < target:
                time.sleep(0.005)
            time.sleep(0.05 if target == 0 else 0.0)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if stage_dir.exists():
                assert_only_complete_outputs(stage_dir)
                partial_kills += 0 < markers(stage_dir) < 8
        proc = cli(work, stage)
        assert proc.wait() == 0, proc.stderr.read().decode()
        assert digest(stage_dir) == reference[stage]
        stats = json.loads((stage_dir / "stats.json").read_text())
        ref_stats = json.loads((ref / "data" / stage / "stats.json").read_text())
        for k in ("docs_in", "docs_out", "dropped", "bytes_out"):
            assert stats[k] == ref_stats[k], k
    assert partial_kills >= 1, "no kill landed mid-stage; the test did not exercise resume"


def test_deterministic_and_param_changes_invalidate_markers(tmp_path):
    p = parse_params(small_raw(tmp_path / "a"))
    q = parse_params(small_raw(tmp_path / "b"))
    for s in ("sample", "download", "extract"):
        run_stage(s, p)
        run_stage(s, q)
    assert digest(tmp_path / "a/extract") == digest(tmp_path / "b/extract")

    assert run_stage("extract", p)["up_to_date"]
    again = run_stage("extract", p, skip_up_to_date=False)
    assert again["resumed_shards"] == again["shards"]  # nothing redone

    changed = parse_params(small_raw(tmp_path / "a", extract={"min_text_chars": 400}))
    st = run_stage("extract", changed)
    assert st["resumed_shards"] == 0 and st["dropped"].get("empty_text", 0) > 0


def redone_passes(st: dict) -> list[str]:
    if st.get("up_to_date"):
        return []
    return [x["name"] for x in st["passes"] if x["resumed"] < (x["shards"] if x["kind"] == "sharded" else 1)]


def test_inputs_count_by_the_content_their_pass_recorded_not_by_their_time(tmp_path, extracted, monkeypatch):
    """A `dvc checkout`, `dvc pull` or copy gives every file a new mtime: with inputs identified by size
    and mtime, every pass after the first redid everything (and rewrote its outputs, so the next did too)."""
    copy_stages(Path(extracted.paths.data_dir), tmp_path / "data")
    p = parse_params(small_raw(tmp_path / "data"))
    for s in ("filter", "dedup"):
        run_stage(s, p)
    later = time.time() + 100
    for k, f in enumerate(sorted((tmp_path / "data").rglob("*"))):  # completions/ before shards/: outputs
        os.utime(f, (later + k, later + k))                          # newer than their markers, hashed again
    for s in ("download", "extract", "filter", "dedup"):
        assert redone_passes(run_stage(s, p)) == [], s

    # a data folder copied or moved elsewhere (a larger disk, a clone at another path) holds the same
    # inputs: with inputs named by absolute path, every shard and global pass was redone
    moved = parse_params(small_raw(tmp_path / "moved"))
    shutil.copytree(tmp_path / "data", tmp_path / "moved")
    for s in ("download", "extract", "filter", "dedup"):
        assert redone_passes(run_stage(s, moved, skip_up_to_date=False)) == [], s
    # and given relative (params.yaml's `data_dir: data`), as a relative path names the same inputs
    monkeypatch.chdir(tmp_path)
    for s in ("download", "extract", "filter", "dedup"):
        assert redone_passes(run_stage(s, parse_params(small_raw(Path("moved"))), skip_up_to_date=False)) == [], s

    # the same size, other bytes (a disk error, a hand edit) after extract wrote it: filter does not keep
    # what it made of the old bytes, and names the shard
    shard = sorted((tmp_path / "data/extract/shards").glob("*.parquet"))[0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[:len(whole) // 2] + bytes(b ^ 0xFF for b in whole[len(whole) // 2:][:64])
                      + whole[len(whole) // 2 + 64:])
    os.utime(shard, (later + 10_000, later + 10_000))  # after the touches above, which were in the future
    with pytest.raises(UnfinishedInput, match=f"input shard {shard} changed since stage 'extract' wrote it"):
        run_stage("filter", p)
    shard.write_bytes(whole)

    # an input its stage wrote again with other bytes is another input: the passes reading it are redone
    run_stage("extract", parse_params(small_raw(tmp_path / "data", extract={"min_text_chars": 400})))
    assert redone_passes(run_stage("filter", p))[:1] == ["rules"]


def test_stale_outputs_are_removed_when_the_plan_shrinks(tmp_path, downloaded):
    copy_stages(downloaded, tmp_path / "d")
    fewer = parse_params(small_raw(tmp_path / "d", download={"n_files": 1}))
    st = run_stage("download", fewer)
    warcs = list((tmp_path / "d/download/shards").glob("*.warc.gz"))
    assert st["shards"] == 3 and len(warcs) == 1
    assert len(list((tmp_path / "d/download/completions").glob("*.json"))) == 3
