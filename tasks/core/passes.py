"""Completion markers and atomic outputs: the guarantees every pass of every stage gets.

A **sharded** pass writes one output file per shard::

    <pass dir>/shards/<output>              the shard's output
    <pass dir>/completions/<name>.json      marker: size, sha256, fingerprint, the shard's stats

A **global** pass writes one output folder from everything before it::

    <stage dir>/<pass>/                     the folder (an index, a table, a tokenizer, ...)
    <stage dir>/<pass>.done.json            marker: per-file sha256, fingerprint, the pass's report

Outputs are written to a hidden temp path beside the final one and renamed into place; only then
is the marker written (also atomically). A `kill -9` at any moment leaves either no output, an
output without a marker (redone), or output + marker (skipped when valid). "Valid" means the
fingerprint (parameters, inputs by content where a pass wrote them, the digests of the passes before,
the stage's code) is unchanged and the bytes on
disk still hash to what the marker recorded; an output whose bytes changed is redone and counted
as `redone_corrupt`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from tasks.core.identity import file_sha256, input_names, input_stat, read_json, records_by_output


class ShardFailed(Exception):
    """Raised by a pass for a shard that cannot be made (a remote file that is gone or still broken
    after retries). The pass goes on: the shard gets no output and no marker (a rerun tries it
    again), stats.json lists it, and the stage fails only past the pass's bound on failures."""


@dataclass(frozen=True)
class Shard:
    name: str  # unique within the pass; names the output and the marker
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


class PassLayout:
    """Where one sharded pass keeps its outputs and markers."""

    def __init__(self, root: Path):
        self.root = root
        self.shards = root / "shards"
        self.completions = root / "completions"

    def prepare(self) -> None:
        self.shards.mkdir(parents=True, exist_ok=True)
        self.completions.mkdir(parents=True, exist_ok=True)
        for d in (self.shards, self.completions):  # leftovers of a killed run
            for tmp in d.glob(".tmp-*"):
                _remove_tree(tmp)

    def marker(self, shard: Shard) -> Path:
        return self.completions / f"{shard.name}.json"

    def output(self, shard: Shard) -> Path:
        return self.shards / shard.output

    def outputs(self) -> list[Path]:
        return sorted(p for p in self.shards.iterdir() if not p.name.startswith(".tmp-"))


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError raised without a file name (pyarrow, zstd, numpy) gets `path`, so the one-line
    error says where the disk was full or the folder unwritable."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno:
            raise OSError(e.errno, os.strerror(e.errno), str(path)) from e
        raise


def tmp_name(final: Path) -> Path:
    return final.parent / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temp path beside `final`; rename it into place only if the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(final)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(OSError):  # a failed cleanup must not hide the error that matters
            tmp.unlink(missing_ok=True)


def atomic_write_text(final: Path, text: str) -> None:
    with naming(final), atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")


def remove_at_once(folder: Path, gone: Path, ignore_errors: bool = False) -> None:
    """Delete `folder` so that a reader finds it whole or gone, never half deleted: renamed to `gone` (a name
    no reader lists), then deleted. A remnant of an earlier deletion in the way: deleted in place."""
    try:
        os.replace(folder, gone)
    except OSError:
        gone = folder
    shutil.rmtree(gone, ignore_errors=ignore_errors)


def savez(fh, **arrays: np.ndarray) -> None:
    """np.savez with fixed zip timestamps: the same arrays give the same bytes (numpy stamps the time)."""
    with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, a in arrays.items():
            with z.open(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)


def load_stored(path: Path, name: str) -> np.ndarray:
    """One array of a `savez` file, memory-mapped read-only: its members are stored uncompressed, so the
    array's bytes lie in the file as they are. A slice reads only the pages it touches (np.load reads
    the whole member)."""
    with zipfile.ZipFile(path) as z:
        at = z.getinfo(f"{name}.npy").header_offset
    with open(path, "rb") as fh:
        fh.seek(at)
        local = fh.read(30)  # the local file header: its name and extra field lengths sit at 26 and 28
        if local[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: member {name}.npy has no local header where the directory says")
        fh.seek(at + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little"))
        version = np.lib.format.read_magic(fh)
        header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        shape, fortran, dtype = header[version](fh)  # savez writes 1.0, or 2.0 for headers over 64 KiB
        offset = fh.tell()
    if 0 in shape:  # np.memmap cannot map zero bytes
        return np.zeros(shape, dtype=dtype, order="F" if fortran else "C")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def tree_files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `root` (sorted, so the dict is canonical)."""
    return {str(f.relative_to(root)): file_sha256(f) for f in sorted(root.rglob("*")) if f.is_file()}


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(pass_params: dict, shard: Shard, data_dir: str | Path, upstream: str = "") -> str:
    """What a shard's output depends on: the pass parameters, each input (input_stat: by content where it
    can, so an input rewritten with other bytes redoes the shard; named relative to `data_dir`, the data
    folder, where it lies in it), and what `upstream` holds: the stage's code and the digest of the
    passes before it in the stage."""
    return digest([pass_params, input_names(shard.inputs, data_dir), input_stat(shard.inputs), shard.output,
                   shard.tag, upstream])


def written_records(layout: PassLayout) -> dict[str, dict]:
    """Output file name -> its completion marker (bytes, sha256, ...); failed shards have none."""
    return {name: r for name, (r, _) in records_by_output(layout.completions).items()}


def global_output_change(out: Path, marker: Path) -> tuple[str, Path] | None:
    """How a global pass's output differs from what its marker recorded, as (kind, path): "missing" (the
    folder, its marker or one of its files), "added" (a file it did not write), "changed" (other bytes);
    None when it does not."""
    record = read_json(marker)
    if not out.is_dir() or record is None:
        return "missing", out if not out.is_dir() else marker
    files, written = tree_files(out), record.get("files", {})
    for rel in sorted(set(files) | set(written)):
        if files.get(rel) != written.get(rel):
            return ("missing" if rel not in files else "added" if rel not in written else "changed"), out / rel
    return None


def written_outputs(layout: PassLayout) -> dict[str, int]:
    """Output file name -> bytes, as the pass's completion markers recorded them."""
    return {name: r["bytes"] for name, r in written_records(layout).items()}


def finished_stats(pass_root: Path, shard_name: str) -> dict:
    """The stats an earlier sharded pass recorded for one shard in its completion marker (a later pass
    of the same stage reads them instead of recomputing what that pass already counted)."""
    record = read_json(PassLayout(pass_root).completions / f"{shard_name}.json")
    if record is None:
        raise ValueError(f"{pass_root}: no completion marker for shard {shard_name}")
    return record["stats"]


ShardFn = Callable[[Shard, Path], ShardStats]


def run_shard(layout: PassLayout, shard: Shard, fn: ShardFn, pass_params: dict, data_dir: str | Path,
              upstream: str = "") -> dict:
    """Run `fn(shard, tmp_output)` unless a valid completion marker says it is done."""
    out, marker = layout.output(shard), layout.marker(shard)
    fp = fingerprint(pass_params, shard, data_dir, upstream)
    done = read_json(marker) if marker.exists() and out.exists() else None
    corrupt = 0
    if done and done.get("fingerprint") == fp:
        if done.get("bytes") == out.stat().st_size and file_sha256(out) == done.get("sha256"):
            return {**done["stats"], "seconds": 0.0, "resumed": 1, "sha256": done["sha256"]}
        corrupt = 1  # same inputs and params, other bytes: the file changed on disk since
    marker.unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        with naming(out), atomic_path(out) as tmp:
            stats = fn(shard, tmp).to_dict()
    except ShardFailed as e:
        out.unlink(missing_ok=True)  # an older output must not pass for this one
        return {"docs_in": 1, "dropped": {"shard_failed": 1}, "seconds": round(time.perf_counter() - start, 4),
                "sha256": None, "failed": {"shard": shard.name, "inputs": list(shard.inputs), "reason": str(e)}}
    seconds = round(time.perf_counter() - start, 4)
    record = {
        "shard": shard.name,
        "output": shard.output,
        "bytes": out.stat().st_size,
        "sha256": file_sha256(out),
        "fingerprint": fp,
        "stats": stats,
    }
    atomic_write_text(marker, json.dumps(record, indent=1, sort_keys=True))
    return {**stats, "seconds": seconds, "redone_corrupt": corrupt, "sha256": record["sha256"]}


def shards_digest(parts: list[dict], shards: list[Shard]) -> str:
    """The content digest of a finished sharded pass (what later passes fingerprint)."""
    return digest([[s.name, p["sha256"]] for s, p in zip(shards, parts)])


def prune(layout: PassLayout, shards: list[Shard]) -> None:
    """Drop outputs and markers no longer planned (e.g. fewer input shards after a param change)."""
    planned = {s.output for s in shards}
    for p in layout.outputs():
        if p.name not in planned:
            p.unlink()
    names = {f"{s.name}.json" for s in shards}
    for m in layout.completions.glob("*.json"):
        if m.name not in names:
            m.unlink()


def _remove_tree(path: Path) -> None:
    with contextlib.suppress(OSError):  # cleanup: never hides the error that caused it
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


GlobalFn = Callable[[Path], dict]


def run_global(out: Path, marker: Path, fn: GlobalFn, fp: str, before_change: Callable[[], None] = lambda: None) -> dict:
    """Run `fn(tmp_folder) -> report` unless a valid marker says `out` is done; the folder is
    built beside `out` and swapped in whole, then the marker (with every file's sha256) follows.
    `before_change` is called once `fn` has succeeded, before `out` or its marker changes: a build that
    fails (a refusal, an interrupt) leaves the last output and its marker as they were."""
    done = read_json(marker) if marker.exists() and out.is_dir() else None
    corrupt = 0
    if done and done.get("fingerprint") == fp:
        if tree_files(out) == done.get("files"):
            return {"report": done.get("report", {}), "digest": done["digest"], "seconds": 0.0, "resumed": 1}
        corrupt = 1
    start = time.perf_counter()
    tmp, old = tmp_name(out), tmp_name(out.with_name(out.name + "-old"))
    tmp.mkdir(parents=True)
    try:
        with naming(out):
            report = fn(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
        before_change()
        marker.unlink(missing_ok=True)  # a kill from here to the new marker: no marker, rebuilt next time
        if out.exists():
            os.rename(out, old)  # a kill here leaves no `out` and no marker: redone next time
        os.rename(tmp, out)
    finally:
        _remove_tree(tmp)
        _remove_tree(old)
    files = tree_files(out)
    record = {"pass": out.name, "fingerprint": fp, "files": files, "digest": digest(files), "report": report}
    atomic_write_text(marker, json.dumps(record, indent=1, sort_keys=True))
    return {"report": report, "digest": record["digest"], "seconds": round(time.perf_counter() - start, 4),
            "resumed": 0, "redone_corrupt": corrupt}


def remove_leftovers(folder: Path) -> None:
    """Temp files and folders a killed run left directly in `folder`."""
    if folder.is_dir():
        for tmp in folder.glob(".tmp-*"):
            _remove_tree(tmp)
