"""The train stage's work folder: the run params.yaml describes, and the one run before it.

data/train/work/ holds the current run (its checkpoints, metrics, launch log) and an `identity` file; another
run moves it to work.previous/, and going back to that run moves it back and resumes it (an lr tried and
reverted loses nothing). Only the run before those two is deleted, and the message says so.

Every step is a rename, and a stage killed between two of them leaves a state the next start recovers:
- work.swap/ (a swap of work and work.previous under way) is put back where a folder is missing, never
  deleted (it deleted the other run silently);
- a new work folder is made as work.new/ with its identity, then renamed (an empty work/ without one was
  taken for a run and moved over work.previous/, deleting a real run);
- a deleted run is renamed to work.deleting/ first, so a half-deleted folder is never mistaken for a run.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tasks.core.errors import ConfigError
from tasks.core.notices import notice
from tasks.core.passes import remove_at_once

IDENTITY = "identity"


def run_in(folder: Path) -> str | None:
    """The identity of the run `folder` holds (None: none)."""
    stamp = folder / IDENTITY
    return stamp.read_text(encoding="utf-8") if stamp.is_file() else None


def _described(folder: Path) -> str:
    from trainer import checkpoint
    try:
        last = checkpoint.latest(folder / "checkpoints")
    except OSError:
        last = None
    return f"its latest checkpoint {last.name}" if last is not None and last.is_dir() else "no checkpoint"


def _holds_a_run(folder: Path) -> bool:
    """A folder with a complete checkpoint: a run worth keeping. A run stopped before its first checkpoint (an
    identity and a launch log; a run cancelled from the UI as train began) is not: it was moved to work.previous/,
    deleting the checkpointed run there, and the one after it then evicted the real run for an empty one."""
    ckpts = folder / "checkpoints"
    return ckpts.is_dir() and any(p.is_dir() and p.name.startswith("step-") and not p.name.endswith(".partial")
                                  for p in ckpts.iterdir())


def _sibling(work: Path, suffix: str) -> Path:
    return work.with_name(work.name + suffix)


def _recover(work: Path, previous: Path) -> None:
    """Finish or undo what a killed start left (see the module's comment)."""
    shutil.rmtree(_sibling(work, ".new"), ignore_errors=True)
    shutil.rmtree(_sibling(work, ".deleting"), ignore_errors=True)
    swap = _sibling(work, ".swap")
    if not swap.exists():
        return
    if not previous.exists():  # killed after the run before was moved back: the other run goes to previous
        os.replace(swap, previous)
    elif not work.exists():  # killed after work was moved aside: undo
        os.replace(swap, work)
    else:
        raise ConfigError(f"train: {swap}, {work} and {previous} all exist (a swap of two runs was interrupted "
                          f"and something else changed them): keep the run you want in {work} and move {swap} aside")


def prepare(work: Path, identity: str) -> None:
    """Make `work` the folder of the run `identity` (resumable if it ran before), as the module says."""
    work = Path(work)
    previous = _sibling(work, ".previous")
    _recover(work, previous)
    if run_in(work) == identity:
        return
    if run_in(previous) == identity:  # back to the run before: swap the two
        swap = _sibling(work, ".swap")
        if work.exists():
            os.replace(work, swap)
        os.replace(previous, work)
        if swap.exists():
            os.replace(swap, previous)
        notice(f"train: this run's parameters describe the run in {previous} ({_described(work)}): moved back to "
               f"{work} to resume" + (f"; the other run moved to {previous}" if previous.exists() else ""))
        return
    if work.exists() and not _holds_a_run(work):
        shutil.rmtree(work)  # no checkpoint: nothing of a run to keep, and never worth the run before
    if work.exists():
        if previous.exists():
            notice(f"train: deleted {previous}, an earlier run ({_described(previous)}): only the last other run is "
                   f"kept")
            remove_at_once(previous, _sibling(work, ".deleting"))
        os.replace(work, previous)
        notice(f"train: this run's parameters describe another run (model, recipe, seed or data changed): the work "
               f"folder's run ({_described(previous)}) moved to {previous}; this run starts from step 0")
    new = _sibling(work, ".new")
    new.mkdir(parents=True)
    (new / IDENTITY).write_text(identity, encoding="utf-8")
    os.replace(new, work)


def _kept_in(work: Path, identity: str) -> Path | None:
    """The folder keeping the run `identity`: `work`, work.previous/ or a killed swap's work.swap/."""
    work = Path(work)
    return next((f for f in (work, _sibling(work, ".previous"), _sibling(work, ".swap")) if run_in(f) == identity),
                None)


def holds(work: Path, identity: str) -> bool:
    """Whether the run `identity` is kept (see _kept_in)."""
    return _kept_in(work, identity) is not None


def resumes_from(work: Path, identity: str) -> dict | None:
    """The meta.json of the checkpoint the run `identity` would resume from (in `work`, or in work.previous/
    or a killed swap's work.swap/, to be moved back), None where it starts from step 0: the stage sizes the
    rest of a resumed run from it."""
    folder = _kept_in(work, identity)
    if folder is None:
        return None
    from trainer import checkpoint  # torch: only for a run that resumes
    try:
        last = checkpoint.latest(folder / "checkpoints")
        return checkpoint.read_meta(last) if last is not None else None
    except (OSError, checkpoint.CheckpointUnreadable):  # the ranks name a damaged one as they load it
        return None
