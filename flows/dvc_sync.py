"""Keep DVC's view in step with runs made through Prefect.

A Prefect run executes the same stage entry points as `dvc repro` but DVC does not see it; so
after a successful run, `dvc commit` records the stages' deps, params and outs in dvc.lock and the
repo is what `dvc status` calls up to date. Only when the run used exactly params.yaml: a run
with other parameters from the UI is an experiment, and recording it would make dvc.lock lie.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tasks.core.config import ConfigError, PipelineParams, load_params


def dvc_repo_root(start: Path = Path(".")) -> Path | None:
    return start.resolve() if (start / ".dvc").is_dir() and (start / "dvc.yaml").is_file() else None


def record_in_dvc(stages: list[str], p: PipelineParams) -> str:
    """`dvc commit` the stages when `p` is exactly what dvc.yaml's stages read: the repo's params.yaml
    (not the file the run was given, which may be another: an experiment)."""
    root = dvc_repo_root()
    if root is None:
        return "not a DVC repo here: nothing recorded"
    try:
        if load_params(root / "params.yaml") != p:
            return "parameters differ from params.yaml: run not recorded in dvc.lock"
    except ConfigError as e:
        return f"params.yaml unreadable ({e}): run not recorded"
    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.exists() else "dvc", "commit", "--force", "--quiet", *stages]
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"dvc commit failed: {out.stderr.strip() or out.stdout.strip()}")
    return f"recorded in dvc.lock: {', '.join(stages)}"
