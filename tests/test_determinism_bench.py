"""benchmarks.determinism's comparison: which differences between two runs' data/ it reports."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.determinism import compare


def write_run(root: Path, shard: bytes, seconds: float, losses: list[str], rows: list) -> Path:
    files = {
        "extract/shards/a.parquet": shard,
        "extract/stats.json": json.dumps({"seconds": seconds}).encode(),
        "train/model/metrics.csv": ("step,loss,tokens_per_s\n" + "".join(
            f"{i},{loss},{seconds}\n" for i, loss in enumerate(losses))).encode(),
        "evaluate/results/results.json": json.dumps({"rows": rows, "generations": [], "seconds": seconds}).encode(),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_only_run_records_may_differ(tmp_path):
    a = write_run(tmp_path / "a", b"PAR1", 1.0, ["7.7", "7.5"], [{"task": "boolq", "value": 0.5}])
    b = write_run(tmp_path / "b", b"PAR1", 2.0, ["7.7", "7.5"], [{"task": "boolq", "value": 0.5}])
    for run in (a, b):  # a shard's marker: data (its fingerprint counts inputs by content)
        (run / "extract/completions").mkdir()
        (run / "extract/completions/a.json").write_text('{"sha256": "e3b0"}')
    same, differ, records = compare(a, b)
    assert same == ["extract/completions/a.json", "extract/shards/a.parquet"] and differ == []
    assert sorted(r for why, rels in records.items() if not why.startswith("(") for r in rels) == [
        "evaluate/results/results.json", "extract/stats.json", "train/model/metrics.csv"]


def test_a_changed_shard_a_loss_a_score_or_a_missing_file_is_reported(tmp_path):
    a = write_run(tmp_path / "a", b"PAR1", 1.0, ["7.7", "7.5"], [{"task": "boolq", "value": 0.5}])
    b = write_run(tmp_path / "b", b"PAR2", 1.0, ["7.7", "7.4"], [{"task": "boolq", "value": 0.6}])
    (a / "extract/shards/b.parquet").write_bytes(b"PAR1")
    _, differ, _ = compare(a, b)
    assert differ == ["evaluate/results/results.json (its deterministic part)", "extract/shards/a.parquet",
                      "extract/shards/b.parquet (only in run 1)", "train/model/metrics.csv (its deterministic part)"]
