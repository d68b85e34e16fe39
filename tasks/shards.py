"""The stage contract: shard in -> shard out, atomic writes, completion markers, stats.

Layout of a stage folder::

    data/<stage>/shards/<name>.<ext>     outputs (DVC `outs`), one per input shard
    data/<stage>/completions/<name>.json marker: output size + sha256 + the shard's stats
    data/<stage>/stats.json              totals for the stage (DVC `metrics`)

A shard's output is written to a temp file in the same folder and renamed into place, and only
then is its marker written (also atomically). A `kill -9` at any moment therefore leaves either
no output, a complete output without a marker (redone), or output + marker (skipped). A marker
also records a fingerprint of the stage parameters and inputs, so changed parameters redo the
shard instead of trusting a stale output.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator


@dataclass(frozen=True)
class Shard:
    name: str  # unique within the stage; names the output and the marker
    inputs: tuple[str, ...]  # local paths or URLs the shard reads
    output: str  # file name under shards/
    tag: str = ""  # stage-specific detail (e.g. a curated dataset's name override)


@dataclass
class ShardStats:
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    extra: dict = field(default_factory=dict)  # stage-specific counters (summed on merge)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n

    def to_dict(self) -> dict:
        return {
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "dropped": dict(sorted(self.dropped.items())),
            **({"extra": dict(sorted(self.extra.items()))} if self.extra else {}),
        }


def merge_stats(parts: list[dict]) -> dict:
    total = {"docs_in": 0, "docs_out": 0, "bytes_in": 0, "bytes_out": 0, "seconds": 0.0}
    dropped: Counter = Counter()
    extra: Counter = Counter()
    for p in parts:
        for k in ("docs_in", "docs_out", "bytes_in", "bytes_out", "seconds"):
            total[k] += p.get(k, 0)
        dropped.update(p.get("dropped", {}))
        extra.update(p.get("extra", {}))
    total["seconds"] = round(total["seconds"], 3)
    total["dropped"] = dict(sorted(dropped.items()))
    if extra:
        total["extra"] = dict(sorted(extra.items()))
    return total


class StageLayout:
    def __init__(self, data_dir: str | Path, stage: str):
        self.stage = stage
        self.root = Path(data_dir) / stage
        self.shards = self.root / "shards"
        self.completions = self.root / "completions"
        self.stats = self.root / "stats.json"

    def prepare(self) -> None:
        self.shards.mkdir(parents=True, exist_ok=True)
        self.completions.mkdir(parents=True, exist_ok=True)
        for d in (self.shards, self.completions):  # leftovers of a killed run
            for tmp in d.glob(".tmp-*"):
                tmp.unlink(missing_ok=True)

    def marker(self, shard: Shard) -> Path:
        return self.completions / f"{shard.name}.json"

    def output(self, shard: Shard) -> Path:
        return self.shards / shard.output

    def outputs(self) -> list[Path]:
        return sorted(p for p in self.shards.iterdir() if not p.name.startswith(".tmp-"))


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temp path beside `final`; rename it into place only if the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(final: Path, text: str) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(stage_params: dict, shard: Shard) -> str:
    """What the output of a shard depends on: the stage parameters and each local input's size
    and modification time (a rewritten input redoes the shard; remote inputs count by name)."""
    seen = []
    for i in shard.inputs:
        p = Path(i)
        st = p.stat() if "://" not in i and p.exists() else None
        seen.append([st.st_size, st.st_mtime_ns] if st else None)
    blob = json.dumps([stage_params, shard.inputs, seen, shard.output, shard.tag], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


ShardFn = Callable[[Shard, Path], ShardStats]


def run_shard(layout: StageLayout, shard: Shard, fn: ShardFn, stage_params: dict) -> dict:
    """Run `fn(shard, tmp_output)` unless a valid completion marker says it is done."""
    out, marker = layout.output(shard), layout.marker(shard)
    fp = fingerprint(stage_params, shard)
    if marker.exists() and out.exists():
        done = json.loads(marker.read_text(encoding="utf-8"))
        if done.get("fingerprint") == fp and done.get("bytes") == out.stat().st_size:
            return {**done["stats"], "seconds": 0.0, "resumed": 1}
    marker.unlink(missing_ok=True)
    start = time.perf_counter()
    with atomic_path(out) as tmp:
        stats = fn(shard, tmp).to_dict()
    stats["seconds"] = round(time.perf_counter() - start, 4)
    record = {
        "shard": shard.name,
        "output": shard.output,
        "bytes": out.stat().st_size,
        "sha256": file_sha256(out),
        "fingerprint": fp,
        "stats": {k: v for k, v in stats.items() if k != "seconds"},
    }
    atomic_write_text(marker, json.dumps(record, indent=1, sort_keys=True))
    return stats


def prune(layout: StageLayout, shards: list[Shard]) -> None:
    """Drop outputs and markers no longer planned (e.g. fewer input shards after a param change)."""
    planned = {s.output for s in shards}
    for p in layout.outputs():
        if p.name not in planned:
            p.unlink()
    names = {f"{s.name}.json" for s in shards}
    for m in layout.completions.glob("*.json"):
        if m.name not in names:
            m.unlink()


def finalize(layout: StageLayout, shards: list[Shard], parts: list[dict], wall_s: float,
             report: Callable[[dict], dict] | None = None) -> dict:
    """Prune outputs no longer planned, then write stats.json."""
    prune(layout, shards)
    stats = {"stage": layout.stage, "shards": len(shards), **merge_stats(parts)}
    stats["resumed_shards"] = sum(p.get("resumed", 0) for p in parts)
    stats["wall_seconds"] = round(wall_s, 3)
    if report is not None:  # stage-specific summary computed from the merged totals
        stats.update(report(stats))
    atomic_write_text(layout.stats, json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return stats
