"""Whether a stage is up to date: a stage whose code, parameters and inputs are those of the run that
made its outputs, and whose outputs are whole, is not run again, as `dvc repro` does not run it.

Why each pass's own resumption is not enough: DVC keeps a stage's outputs (dvc.yaml `outs`: the passes
a stage declares `kept`), not its intermediate passes (dedup's signatures and buckets, filter's rules
and scores). After a `dvc pull` or checkout those are missing, and walking the passes rebuilt them all
(at scale, hours over the whole corpus) only to find the output pass's markers matching.

The stage's key (stats.json `fingerprint.stage`) is a digest of
- the stage's code (tasks.core.source), its validation suites' code (a changed suite runs the stage and
  validates it again: a suite may read intermediate passes, which a pulled stage lacks), every pass's
  parameters and the stage's whole params section (its suite reads some that no pass does: filter's
  kept-fraction bounds, dedup's recheck sample);
- its input stage's name and every file of that stage's kept passes, by the identity its passes use
  (tasks.core.identity: by the sha256 the writing pass recorded while the file is no newer than that
  record, else by its own sha256, remembered);
- every other file it reads (Stage.other_inputs: the task files, a user's tokenizer, model or corpus,
  another stage's output), by path (relative to the data folder where it lies in it) and identity. The
  runner refuses a pass input that is neither (DeclaredInputs), so whatever a pass's fingerprint counts,
  the key counts.

`fingerprint.outputs` binds stats.json to the outputs it describes: a digest of the kept passes' markers.
A stage is skipped when its stats.json records the same key, no failed shards and no failed or pending
validation, its kept passes' markers digest to the recorded value, and every file of them is what its
marker records (no file missing, added or changed).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from tasks.core.config import PipelineParams
from tasks.core.identity import done_marker, input_stat, read_json, records_by_output
from tasks.core.passes import digest
from tasks.core.stage import Context, Pass, ShardedPass, Stage


def kept_passes(st: Stage) -> list[Pass]:
    """The passes DVC keeps (the stage's `kept` ones and its output pass), in stage order."""
    return [ps for ps in st.passes if ps.name in st.kept or ps is st.output_pass()]


def pass_files(st: Stage, data_dir: str | Path, ps: Pass) -> dict[str, Path]:
    """A pass's output files by name: a sharded pass's shards (hidden files are no shards), or every file
    of a global pass's folder by its path in the folder (its marker records each)."""
    root = st.pass_root(data_dir, ps)
    if isinstance(ps, ShardedPass):
        folder = root / "shards"
        return {f.name: f for f in sorted(folder.iterdir()) if not f.name.startswith(".")} if folder.is_dir() else {}
    return {str(f.relative_to(root)): f for f in sorted(root.rglob("*")) if f.is_file()} if root.is_dir() else {}


def _recorded(st: Stage, data_dir: str | Path, ps: Pass) -> dict[str, str] | None:
    """What a kept pass's markers record: output name -> sha256; None for a global pass without its marker."""
    root = st.pass_root(data_dir, ps)
    if isinstance(ps, ShardedPass):
        return {name: r.get("sha256") for name, (r, _) in records_by_output(root / "completions").items()}
    done = read_json(done_marker(root))
    return None if done is None else dict(done.get("files", {}))


def stage_key(st: Stage, p: PipelineParams, ctx: Context, source: Stage | None, other: list[str]) -> str:
    """The stage's key (the module's docstring): `source` is its input stage, `other` its other inputs."""
    data = Path(p.paths.data_dir)
    inputs = []
    for ps in kept_passes(source) if source is not None else []:
        files = pass_files(source, data, ps)
        inputs.append([ps.name, sorted(files), input_stat([str(f) for f in files.values()])])
    section = p.model_dump(mode="json")[st.section]
    where = [os.path.relpath(f, data) if _under(f, data) else f for f in other]
    return digest([ctx.code, [[ps.name, ps.params(p)] for ps in st.passes], section, ctx.input_stage, inputs,
                   where, input_stat(other)])


def _under(path: str | Path, folder: str | Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def outputs_digest(st: Stage, data_dir: str | Path) -> str | None:
    """A digest of what the kept passes' markers record; None when a global pass has no marker."""
    found = []
    for ps in kept_passes(st):
        recorded = _recorded(st, data_dir, ps)
        if recorded is None:
            return None
        found.append([ps.name, sorted(recorded.items())])
    return digest(found)


def outputs_whole(st: Stage, data_dir: str | Path) -> bool:
    """Every kept pass's files are exactly those its markers record, with the recorded contents."""
    for ps in kept_passes(st):
        recorded, files = _recorded(st, data_dir, ps), pass_files(st, data_dir, ps)
        if recorded is None or set(recorded) != set(files):
            return False
        for name, stat in zip(files, input_stat([str(f) for f in files.values()])):
            if stat != ["sha256", recorded[name]]:
                return False
    return True


def up_to_date(st: Stage, stats_file: Path, key: str, data_dir: str | Path) -> dict | None:
    """The stats.json of the run that made the stage's outputs, when the stage need not run again."""
    stats = read_json(stats_file)
    if stats is None or (stats.get("fingerprint") or {}).get("stage") != key:
        return None
    validation = stats.get("validation") or {}
    if stats.get("failed_shards") or stats.get("adopted") or validation.get("success") is False \
            or validation.get("pending"):
        return None  # failed shards are retried; a failed or unfinished validation is not a finished stage
    if stats["fingerprint"].get("outputs") != outputs_digest(st, data_dir) or not outputs_whole(st, data_dir):
        return None
    return stats


def _forms(path: str | Path) -> set[Path]:
    """A path as written (absolute) and with its links resolved: a file of a DVC symlink cache, or a shards
    folder linked to another disk, lies in its stage's folder by the first and elsewhere by the second."""
    return {Path(os.path.abspath(path)), Path(path).resolve()}


class DeclaredInputs:
    """Where a stage's passes may read: its own folder, its input stage's, and its declared other inputs
    (Stage.other_inputs), which the stage's key counts. A pass reading anything else is a mistake in the
    stage's declaration, refused on every run, not only in tests."""

    def __init__(self, st: Stage, data_dir: str | Path, input_stage: str | None, other: list[str],
                 listed_again: Callable[[], list[str]]):
        self.st, self.listed_again = st, listed_again
        self.roots = set().union(*(_forms(Path(data_dir) / s) for s in (st.name, input_stage) if s is not None))
        self.files = set().union(*map(_forms, other))

    def _declared(self, path: str) -> bool:
        forms = _forms(path)
        return bool(forms & self.files) or any(f.is_relative_to(root) for f in forms for root in self.roots)

    def check(self, pass_name: str, paths) -> None:
        for i in paths:
            if "://" in i or not Path(i).exists():
                continue  # a URL, or a path on the remote server: counted by name, as the passes count it
            if not self._declared(i):  # a task file or curated match that appeared since they were listed?
                self.files |= set().union(*map(_forms, self.listed_again()))
            if not self._declared(i):
                raise RuntimeError(f"stage '{self.st.name}': pass '{pass_name}' reads {i}, which is neither in its "
                                   f"input stage's folder nor among the files the stage declares it reads "
                                   f"(Stage.other_inputs)")
