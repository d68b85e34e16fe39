"""What identifies a pass's input in its fingerprint: by content wherever it can.

A `dvc checkout`, `dvc pull` or copy gives every file a new mtime; inputs counted by size and mtime
made every pass after the first redo everything, each rewriting its outputs for the next. So:

- a file a pass wrote counts by the sha256 that pass recorded (its completion marker, or its global
  pass's `.done.json`), while the file is no newer than that record in mtime and ctime: the pass writes
  the record after the file, so a newer file (a copy, a checkout, a hand edit, an old version put back
  with its old mtime) is hashed again, and that hash remembered (below);
- any other file (a task file, a user's tokenizer or corpus file) by its own sha256: up to SMALL_INPUT
  hashed once per stage run; above it hashed once per change of its size, mtime, ctime or inode,
  remembered under the data folder (`.input-hashes/`), since a curated corpus can be hundreds of GB;
- a remote input (a URL) by its name only.

What is read is kept for one stage run (recorded_for): markers once per change, not once per shard.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

SMALL_INPUT = 64 << 20  # an input no pass wrote is hashed each stage run up to this size, remembered above it

# (a marker file, a completions folder or an input; what read it) -> (its size and mtime, what was read)
_CACHE: dict[tuple[str, str], tuple[tuple[int, int], object]] = {}
_RUN: dict[str, object] = {"id": "", "remembered": None}  # the stage run the cache was filled in


def recorded_for(run: str, data_dir: str | Path | None = None) -> None:
    """Keep what input_stat read only within one stage run: the runner calls this as a stage starts,
    and each shard with the run's id (a long-lived Dask or process worker then drops what it read in an
    earlier run, when an earlier stage may have rewritten markers within one tick of the file system's
    clock). `data_dir`: where large inputs' hashes are remembered; without it they count by size and mtime."""
    if run != _RUN["id"]:
        _CACHE.clear()
        _RUN["id"] = run
    _RUN["remembered"] = Path(data_dir) / ".input-hashes" if data_dir is not None else None


def input_names(paths, data_dir: str | Path) -> list[str]:
    """Each input as a fingerprint names it: a path under the data folder relative to that folder, any
    other as given. A data folder moved to a larger disk, or copied, or `dvc pull`ed into a clone at
    another path holds the same inputs: named by absolute path, every finished shard was redone."""
    root = os.path.abspath(data_dir)
    names = []
    for i in paths:  # a relative path too: params.yaml's data_dir is `data`, then given as an absolute one
        if "://" not in i:
            rel = os.path.relpath(os.path.abspath(i), root)
            if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
                i = os.path.join("$data", rel)
        names.append(i)
    return names


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cached(path: Path, read: Callable[[Path], object]):
    """read(path), again only once the path's size or mtime changed; None if the path is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    stamp, key = (st.st_size, st.st_mtime_ns), (str(path), read.__qualname__)
    hit = _CACHE.get(key)
    if hit is None or hit[0] != stamp:
        hit = _CACHE[key] = (stamp, read(path))
    return hit[1]


def input_stat(paths) -> list:
    """Each input's identity, as the module's docstring says: ["sha256", hex], or [size, mtime_ns] for a
    large file no pass wrote with nowhere to remember its hash, or None for a remote or missing one."""
    seen = []
    for i in paths:
        p = Path(i)
        st = p.stat() if "://" not in i and p.exists() else None
        recorded = recorded_sha256(p, st) if st else None
        sha = recorded[0] if recorded and recorded[1] else None
        if sha is None and st:
            if recorded or st.st_size > SMALL_INPUT:  # remembered: not a read of it all on every run
                sha = _cached(p, remembered_sha256) or (_cached(p, file_sha256) if recorded else None)
            else:
                sha = _cached(p, file_sha256)
        seen.append(["sha256", sha] if sha else [st.st_size, st.st_mtime_ns] if st else None)
    return seen


RACY_NS = 2_000_000_000  # a file modified this recently may still change within its mtime's tick: not remembered


def remembered_sha256(path: Path) -> str | None:
    """The file's sha256, hashed only when its size, mtime, ctime or inode differs from what was
    remembered for it (a file that only got a new mtime is hashed once, then found the same; a file put
    back with its old mtime, by `rsync -a` or `cp -p`, has a new ctime). None where there is nowhere to
    remember it. A file that changed while it was hashed, or was modified within the last RACY_NS (a
    writer may still be at it within the file system's clock tick), is hashed but not remembered."""
    folder = _RUN["remembered"]
    if folder is None:
        return None
    where = str(path.resolve())
    record = folder / f"{hashlib.sha256(where.encode()).hexdigest()[:32]}.json"
    st = path.stat()
    key = {"path": where, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
           "inode": st.st_ino}
    known = read_json(record) or {}
    if all(known.get(k) == v for k, v in key.items()) and known.get("sha256"):
        return known["sha256"]
    started = time.time_ns()
    sha = file_sha256(path)
    after = path.stat()
    if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns) \
            and started - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
        from tasks.core.passes import atomic_write_text  # (passes imports this module)
        with contextlib.suppress(OSError):  # a read-only data folder, a full disk: hashed again next run
            atomic_write_text(record, json.dumps({**key, "sha256": sha}, sort_keys=True))
    return sha


def done_marker(folder: Path) -> Path:
    """A global pass's completion marker, beside the folder it wrote (tasks.core.passes)."""
    return folder.with_name(f"{folder.name}.done.json")


def recorded_sha256(path: Path, st: os.stat_result) -> tuple[str, bool] | None:
    """The sha256 a pass recorded for the file it wrote at `path`, and whether it still stands for the
    file: whether the file is no newer than the record. The record is a sharded pass's completion marker
    (only while the file has the recorded size), or for a file of a global pass's folder the folder's
    .done.json (whose every file the next stage hashes before it starts: check_input_passes). None for a
    file no pass wrote (a user's file, a task file)."""
    if path.parent.name == "shards":
        records = _cached(path.parent.parent / "completions", records_by_output) or {}
        r, stamp = records.get(path.name, (None, 0))
        if r is not None:
            return (r["sha256"], _not_newer(st, stamp)) if r.get("bytes") == st.st_size else None
    for folder in (f for f in path.parents if f.name):  # not "/" or ".": no name, no pass
        done = done_marker(folder)
        if done.is_file():
            files, stamp = _cached(done, lambda f: ((read_json(f) or {}).get("files", {}), f.stat().st_mtime_ns)) \
                or ({}, 0)
            sha = files.get(str(path.relative_to(folder)))
            return (sha, _not_newer(st, stamp)) if sha else None
    return None


def _not_newer(st: os.stat_result, record_mtime_ns: int) -> bool:
    """Whether a file is no newer than its record, in content (mtime) and in inode (ctime: a file put
    back with an old mtime by `cp -p` or `rsync -a` was changed now). A pass renames its output into
    place and then writes the record, so both come before the record's mtime."""
    return max(st.st_mtime_ns, st.st_ctime_ns) <= record_mtime_ns


def records_by_output(completions: Path) -> dict[str, tuple[dict, int]]:
    """Output file name -> (its completion marker, the marker's mtime), from a sharded pass's completions
    folder (temporary and unreadable markers left out)."""
    found = {}
    for m in completions.glob("*.json"):
        r = None if m.name.startswith(".tmp-") else read_json(m)
        with contextlib.suppress(OSError, KeyError, TypeError):
            if r is not None:
                found[r["output"]] = (r, m.stat().st_mtime_ns)
    return found


def read_json(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
