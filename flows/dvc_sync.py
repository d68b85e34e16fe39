"""Keep DVC's view in step with runs made through Prefect.

A Prefect run executes the same stage entry points as `dvc repro` but DVC does not see it; so
after a successful run, `dvc commit` records the stages' deps, params and outs in dvc.lock and the
repo is what `dvc status` calls up to date. Only when the run used exactly params.yaml: a run
with other parameters from the UI is an experiment, and recording it would make dvc.lock lie.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tasks.core import interrupts, registry
from tasks.core.config import ConfigError, PipelineParams, dvc_repo_root, load_params, untracked_data_dir
from tasks.core.runner import stats_path
from tasks.core.source import changed_since_loaded


def without_scm(root: Path) -> bool:
    """DVC needs the project in a git work tree unless it was set up with `dvc init --no-scm`; a
    project unpacked from an archive has neither (the run is fine; only DVC's record is not)."""
    if any((d / ".git").exists() for d in (root, *root.parents)) or os.environ.get("GIT_DIR"):
        return False
    config = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in
                       (root / ".dvc" / "config", root / ".dvc" / "config.local") if f.is_file())
    return re.search(r"(?mi)^\s*no_scm\s*=\s*true\s*$", config) is None


def dvc_error(output: str) -> str:
    """DVC's own cause: its last `ERROR:` line (`--quiet` would have left none), else its last line."""
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    errors = [x.removeprefix("ERROR:").strip() for x in lines if x.startswith("ERROR:")]
    return (errors or lines or ["no output"])[-1]


def record_in_dvc(stages: list[str], p: PipelineParams) -> str:
    """`dvc commit` the stages when `p` is exactly what dvc.yaml's stages read: the repo's params.yaml
    (not the file the run was given, which may be another: an experiment)."""
    root = dvc_repo_root()
    if root is None:
        return "not a DVC repo here: nothing recorded"
    if without_scm(root):
        return (f"not recorded in dvc.lock: {root} is not in a git repository (DVC needs one: "
                "`git init`, or `dvc init --no-scm`)")
    try:
        if load_params(root / "params.yaml") != p:
            return "parameters differ from params.yaml: run not recorded in dvc.lock"
    except ConfigError as e:
        return f"params.yaml unreadable ({e}): run not recorded"
    if why := untracked_data_dir(p.paths.data_dir, root):  # dvc commit would fail on its first output
        return f"not recorded in dvc.lock: {why}"
    edited = [s for s in stages if changed_since_loaded(registry.stage(s).code)]
    stages = [s for s in stages if s not in edited]
    skipped = (f"not recorded in dvc.lock: the code of {', '.join(edited)} changed while the run was under way "
               f"(the outputs are the old code's; the next run redoes them)") if edited else ""
    if not stages:
        return skipped
    repaired = _set_aside_if_damaged(root / "dvc.lock")
    if repaired:  # the other stages' records went with it: every stage with outputs is recorded again
        stages = [s for s in registry.PIPELINE if s not in edited and stats_path(p, s).is_file()]
    code, output = _dvc_to_the_end(["commit", "--force", *stages], root)
    if code != 0 and "Unable to acquire lock" in output:  # a stage running in data/ holds it (tasks.core.runner)
        return (f"not recorded in dvc.lock: a stage running in {p.paths.data_dir} holds DVC's lock (a train run "
                f"can for days); `dvc commit {' '.join(stages)}` records this run once it ends")
    if code != 0:
        raise RuntimeError(f"dvc commit failed: {dvc_error(output)}")
    return (f"{repaired}recorded in dvc.lock: {', '.join(stages)}" + (f"; {skipped}" if skipped else ""))


def _set_aside_if_damaged(lock: Path) -> str:
    """A dvc.lock that DVC's own schema refuses (cut short, or emptied, by a dvc killed as it wrote it: it
    writes the file in place) is moved to dvc.lock.damaged: every later run failed on it with "dvc commit
    failed: required key not provided". (One cut where the schema still holds is rewritten by the commit.)
    Returns what was done, for the log line."""
    if not lock.is_file():
        return ""
    from dvc.schema import COMPILED_LOCKFILE_SCHEMA
    try:
        COMPILED_LOCKFILE_SCHEMA(yaml.safe_load(lock.read_text(encoding="utf-8")))
        return ""
    except Exception:  # noqa: BLE001 - YAML, decoding or schema: whichever, DVC cannot read it
        pass
    os.replace(lock, lock.with_name("dvc.lock.damaged"))
    return f"{lock} was damaged (kept as dvc.lock.damaged); "


def _dvc_to_the_end(args: list[str], root: Path) -> tuple[int, str]:
    """Run dvc in a session of its own and wait for it whatever comes: a Ctrl-C or SIGTERM to the run's
    process group killed it while it wrote dvc.lock, which it writes in place, and left the file cut short
    or empty. It takes seconds; the stop is raised once it has ended."""
    dvc = Path(sys.executable).with_name("dvc")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([str(dvc) if dvc.exists() else "dvc", *args], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        stop = None
        while True:
            try:
                proc.wait()
                break
            except BaseException as e:
                if not interrupts.stops_the_run(type(e)):
                    raise
                stop = e
        if stop is not None:
            raise stop
        out.seek(0)
        return proc.returncode, out.read().decode("utf-8", "replace")
