"""Recurring evaluation of a training run's checkpoints: each complete checkpoint not yet evaluated with
the current evaluation settings is evaluated once, its results written to history/<checkpoint>-<settings>/
(atomically: a temp folder renamed), and one line appended to history.jsonl. Idempotent: a second pass
evaluates nothing twice. Settings changed (tasks, shots, k, limit, seed) re-evaluate every checkpoint
still there, so that one curve never joins scores of different tasks or doc samples. A crash
mid-way leaves no half result: the next pass redoes that checkpoint only. A checkpoint still being
written (`*.partial`, or without its meta.json, which is written last) is never picked, and two
passes never run at once (a lock file)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from tasks.core.errors import InputFileError, StageBusy
from tasks.core.passes import atomic_write_text
from tasks.evaluate.config import EvaluateParams
from tasks.core.source import loaded_code_digest
from tasks.evalsets.loaders import TASK_FILES, task_files
from tasks.evaluate.run import RESULTS, run

HISTORY = "history.jsonl"
GONE = ("was removed or moved while being evaluated (pruned by training, or moved to work.previous/ with its run "
        "when another run started)")


def checkpoint_key(folder: Path) -> str:
    """The checkpoint's name and its meta.json's hash: another run's step-N is another checkpoint (meta.json
    records the run's identity: model, recipe, seed, and under the train stage its data)."""
    return f"{folder.name}:{hashlib.sha256((folder / 'meta.json').read_bytes()).hexdigest()[:12]}"


# the code an entry's scores depend on: prompts and loaders, scoring, batching, the model's loading (a changed
# prompt left the old checkpoints' old-code scores beside the new ones' in one curve); not the schedule's own
EVAL_CODE = ("tasks/evalsets", "tasks/evaluate/evaluator.py", "tasks/evaluate/scoring.py", "tasks/evaluate/model_io.py")
LATER_KEYS = ("data", "code")  # added to the settings later: an entry recorded before a key existed still counts


def settings_of(cfg: EvaluateParams, benchmarks_dir: str | Path) -> dict:
    """What an entry's metrics depend on besides the checkpoint: the tasks, each one's shot counts, the docs
    drawn (limit, seed), the evaluated tasks' files (pointed at another copy of the sets, the scheduled pass
    evaluated nothing and the curve joined scores of other data) and the evaluation code. Not the scoring batch,
    the device or the generation samples, which leave the scores as they are."""
    tasks = sorted(set(cfg.tasks))
    return {"tasks": tasks, "shots": {t: sorted(set(cfg.shot_counts(t))) for t in tasks}, "limit": cfg.limit,
            "seed": cfg.seed, "data": task_data(benchmarks_dir, tasks), "code": loaded_code_digest(EVAL_CODE)}


def task_data(benchmarks_dir: str | Path, tasks: Sequence[str] | None = None) -> str:
    """A short hash of the task files' names and bytes: those in the folders of `tasks` (every file under the
    benchmarks folder with None, as entries recorded it before), leaving out hidden files and editor backups (a
    README edited, another task's file or an editor's swap file evaluated every checkpoint again and hid the
    earlier ones, which training had pruned, from the curve)."""
    root, h = Path(benchmarks_dir), hashlib.sha256()
    files = task_files(root)
    if tasks is not None:
        folders = {rel.split("/")[0] for t in tasks for rel in TASK_FILES[t]}
        files = [f for f in files if (rel := Path(f).relative_to(root)).parts[0] in folders
                 and not any(x.startswith(".") or x.endswith("~") for x in rel.parts)]
    for f in files:
        h.update(str(Path(f).relative_to(root)).encode() + b"\0" + hashlib.sha256(Path(f).read_bytes()).digest())
    return h.hexdigest()[:16]


def settings_key(settings: dict) -> str:
    """A short hash of the settings, in the name of the results folder."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def settings_text(settings: dict) -> str:
    """The settings as a line of the published history."""
    shots = [f"{k}-shot" for k in sorted({k for ks in settings["shots"].values() for k in ks if k <= 1})]
    few = [f"{t} {k}" for t, ks in settings["shots"].items() for k in ks if k > 1]
    shots += [f"few-shot (k: {', '.join(few)})"] if few else []
    docs = "every doc" if settings["limit"] is None else f"{settings['limit']} docs per task"
    return f"{', '.join(settings['tasks'])}; {', '.join(shots)}; {docs}; seed {settings['seed']}"


def complete_checkpoints(directory: Path) -> list[Path]:
    if not Path(directory).is_dir():
        return []
    return sorted(p for p in Path(directory).glob("step-*")
                  if p.is_dir() and not p.name.endswith(".partial") and (p / "meta.json").is_file())


def read_history(history_dir: Path) -> list[dict]:
    path = Path(history_dir) / HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _append(history_dir: Path, entry: dict) -> None:
    lines = read_history(history_dir) + [entry]
    atomic_write_text(Path(history_dir) / HISTORY, "".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))


@contextmanager
def _lock(history_dir: Path) -> Iterator[None]:
    Path(history_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(history_dir) / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StageBusy(f"another evaluation of {history_dir} is running") from None
        yield


def results_folder(key: str, settings: dict | None = None) -> str:
    """One folder per checkpoint key and settings: another run's step-N (other meta.json), or the same
    checkpoint evaluated with other settings, never overwrites it."""
    name, digest = key.split(":")
    return f"{name}-{digest}" + (f"-{settings_key(settings)}" if settings else "")


def _entry(key: str, results: dict, run_id: str, settings: dict) -> dict:
    ck = results["provenance"]["checkpoint"]
    return {"checkpoint": key, "run": run_id, "step": ck["step"], "tokens": ck["tokens"], "settings": settings,
            "results": f"{results_folder(key, settings)}/{RESULTS}",
            "metrics": {f"{r['task']}/{r['shots']}-shot/{r['metric']}": r["value"] for r in results["rows"]}}


def _read_results(path: Path) -> dict:
    """A results.json evaluated but not yet listed; {} when there is none or it is damaged (the checkpoint
    is evaluated again: a truncated file failed every later scheduled pass)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    prov = found.get("provenance") if isinstance(found, dict) else None
    ok = isinstance(prov, dict) and isinstance(prov.get("checkpoint"), dict) and isinstance(found.get("rows"), list)
    return found if ok else {}


class CheckpointsUnreadable(InputFileError):
    """Damaged checkpoints, or ones that do not fit their model, each reported and left out of the history (and
    tried again by the next pass); the others were evaluated."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _scored(settings: dict) -> set[str]:
    return {f"{t}/{k}-shot" for t, ks in settings["shots"].items() for k in ks}


def unrecorded(entry: dict) -> bool:
    """An entry written before entries recorded their settings."""
    return "settings" not in entry


def run_tokenizer(checkpoints_dir: Path, default: Path) -> Path:
    """The tokenizer the run in `checkpoints_dir`/.. trained with, where its folder keeps one; else `default`."""
    own = Path(checkpoints_dir).parent / "tokenizer.json"
    return own if own.is_file() else Path(default)


def current(entries: list[dict], settings: dict, benchmarks_dir: str | Path | None = None) -> list[dict]:
    """The entries evaluated with `settings` (settings_of: it hashes the task files, so once per pass). An
    entry from before settings were recorded counts as one when it scored the same tasks and shot counts (its
    limit and seed are not known); one from before a LATER_KEYS key was recorded when its other settings are
    these; and one whose task-file hash covered the whole benchmarks folder when that folder's hash is the
    same now (with `benchmarks_dir`): the upgrades neither evaluate every checkpoint again nor lose those that
    training has pruned since."""
    scored = _scored(settings)
    base = {k: v for k, v in settings.items() if k not in LATER_KEYS}
    whole: list[str] = []  # the whole folder's hash, as entries recorded it before: computed only if one did

    def same(e: dict) -> bool:
        got = e.get("settings")
        if not isinstance(got, dict):
            return unrecorded(e) and {k.rsplit("/", 1)[0] for k in e["metrics"]} == scored
        if {k: v for k, v in got.items() if k not in LATER_KEYS} != base:
            return False
        if "code" in got:  # recorded as settings_of records them now
            return got["code"] == settings["code"] and got.get("data") == settings["data"]
        if "data" not in got or benchmarks_dir is None:
            return "data" not in got
        whole[:] = whole or [task_data(benchmarks_dir)]
        return got["data"] == whole[0]
    return [e for e in entries if same(e)]


def evaluate_new(checkpoints_dir: Path | Sequence[Path], tokenizer: Path, cfg: EvaluateParams, benchmarks_dir: Path,
                 history_dir: Path, provenance: dict, check: Callable[[], None] | None = None,
                 say: Callable[[str], None] = _stderr) -> list[dict]:
    """Evaluate every complete checkpoint not in the history with cfg's settings; returns the new history
    entries. `checkpoints_dir` may be several folders (the current run's, then the run before's), evaluated
    in that order under one hold of the lock: a pass run beside it waits for none of them half done. A checkpoint
    whose files cannot be read is reported and left for the next pass, after the others are evaluated
    (one damaged checkpoint stopped every later one from being evaluated, on every scheduled run); the
    pass then fails with CheckpointsUnreadable naming them. `check` runs once, before the first checkpoint
    is evaluated (the flow's check of the tokenizer: a pass with nothing new needs no tokenizer yet). `say`
    takes the lines about checkpoints skipped or left out (the flow logs them in the run's log).
    A checkpoint gone while it is read was pruned by training (which removes a checkpoint at once, see
    trainer.checkpoint.prune), or moved with its run to work.previous/ when another run started: it is
    skipped, whatever error reading it raised."""
    from tasks.evaluate.model_io import CheckpointMismatch
    from trainer.checkpoint import CheckpointUnreadable
    history_dir = Path(history_dir)
    new, damaged = [], []
    settings = settings_of(cfg, benchmarks_dir)
    dirs = [Path(checkpoints_dir)] if isinstance(checkpoints_dir, (str, Path)) else [Path(d) for d in checkpoints_dir]
    with _lock(history_dir):
        done = {e["checkpoint"] for e in current(read_history(history_dir), settings, benchmarks_dir)}
        # each folder listed when reached: a run moved to work.previous/ during the pass is found there; each
        # scored with its run's own tokenizer where the run folder keeps one (the train stage does): the run
        # before, or one a new blend is about to replace, was scored with the new blend's tokenizer, silently
        # where it pads to the same size
        for folder, tok in ((c, run_tokenizer(d, tokenizer)) for d in dirs for c in complete_checkpoints(d)):
            try:
                key = checkpoint_key(folder)
            except FileNotFoundError:  # pruned by the training run since it was listed
                continue
            if key in done:
                continue
            final = history_dir / results_folder(key, settings)
            listed = _read_results(final / RESULTS)
            if listed.get("key") == key and listed.get("settings") == settings:
                results = listed  # evaluated, not yet listed
            else:
                if check is not None:
                    check()
                    check = None
                tmp = history_dir / f".{results_folder(key, settings)}.partial"
                shutil.rmtree(tmp, ignore_errors=True)
                try:
                    results = run(folder, tok, cfg, benchmarks_dir, tmp, {**provenance, "key": key})
                except Exception as e:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if not folder.exists():  # whatever the read raised, there is nothing to evaluate any more
                        say(f"evaluate: {folder} {GONE}; skipped")
                        continue
                    if not isinstance(e, (CheckpointUnreadable, CheckpointMismatch)):
                        raise
                    say(f"evaluate: {folder.name} not evaluated: {e}")
                    damaged.append(f"{folder.name} ({e})")
                    continue
                try:
                    same = checkpoint_key(folder) == key
                except FileNotFoundError:
                    same = False
                if not same:  # re-saved, pruned or moved while being read: the weights may not be the key's
                    say(f"evaluate: {folder} " + ("changed while being evaluated; left for the next run"
                        if folder.exists() else f"{GONE}; skipped"))
                    shutil.rmtree(tmp, ignore_errors=True)
                    continue
                results["key"], results["settings"] = key, settings
                atomic_write_text(tmp / RESULTS, json.dumps(results, indent=1) + "\n")
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            try:  # the run it belongs to: after a new run, two runs' step-N sit side by side in the history
                run_id = json.loads((folder / "meta.json").read_text(encoding="utf-8")).get("run", "")
            except (OSError, ValueError):
                run_id = ""
            entry = _entry(key, results, run_id, settings)
            _append(history_dir, entry)
            new.append(entry)
            done.add(key)  # found again in the run before's folder (moved there during this pass): listed once
    if damaged:
        where = " and ".join(str(d) for d in dirs if d.is_dir())
        failed = CheckpointsUnreadable(f"{len(damaged)} checkpoint(s) of {where} could not be read or do not fit "
                                       f"their model and are left out of the history ({len(new)} evaluated): "
                                       + "; ".join(damaged))
        failed.new = new
        raise failed
    return new
