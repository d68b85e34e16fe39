"""Where an evaluation number came from: the code (git commit), the data (the dvc.lock hash of every
data stage the model was trained on, and that stage's validation result and Data Docs page), the
parameters (a hash of params.yaml's models), the checkpoint (step, tokens) and the Prefect flow run.

    python -m tasks.evaluate.provenance data/evaluate/results/results.json [task] [metric]

prints one number's lineage from a results file."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tasks.core.errors import InputFileError, PipelineError, describe

DATA_STAGES = ("sample", "download", "extract", "filter", "dedup", "decontaminate", "tokenize", "train")


def git_commit(root: Path) -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def dvc_lock(root: Path, data_dir: Path) -> dict:
    """stage -> {out path: md5} from dvc.lock (recorded by `dvc repro` and by the Prefect flows)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages", {})
    return {name: {o["path"]: o.get("md5") for o in st.get("outs", [])} for name, st in stages.items()
            if name in DATA_STAGES}


def validations(data_dir: Path) -> dict:
    out = {}
    for stage in DATA_STAGES:
        stats = Path(data_dir) / stage / "stats.json"
        if stats.is_file():
            v = json.loads(stats.read_text(encoding="utf-8")).get("validation") or {}
            out[stage] = {"success": v.get("success"), "data_docs": v.get("docs")}
    return out


def params_hash(dumped: dict) -> str:
    return hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()[:16]


def left_out_of_lock() -> list[str]:
    """The stages this process loaded whose code changed while it ran: the pipeline leaves them out of
    dvc.lock (flows.dvc_sync), whose entries for them are then an earlier run's."""
    from tasks.core import registry
    from tasks.core.source import changed_since_loaded
    return [s for s in DATA_STAGES if changed_since_loaded(registry.stage(s).code)]


def collect(root: Path, data_dir: Path, params: dict, checkpoint: dict) -> dict:
    lock, left_out = dvc_lock(root, data_dir), left_out_of_lock()
    for stage in left_out:
        lock.pop(stage, None)
    return {"git": git_commit(root), "dvc_lock": lock, "dvc_lock_left_out": left_out,
            "validation": validations(data_dir), "params_sha256": params_hash(params), "checkpoint": checkpoint,
            # Prefect sets it in a deployment's run process; the stage flows set it for in-process runs
            "prefect_flow_run_id": os.environ.get("PREFECT__FLOW_RUN_ID")}


def current_run(data_dir: Path) -> str:
    """The identity of the training run in data_dir's train stage ('' when there is none)."""
    from tasks.train.work_folder import run_in
    return run_in(Path(data_dir) / "train" / "work") or ""


def cited_for(prov: dict, model_run: str | None, path: Path) -> dict:
    """`prov` for a model: the pipeline's data lineage (dvc.lock, validations) is the model's only if the
    train stage's current run made it (prov["train_run"]; absent: the train stage's own model). A Hugging Face
    folder or another run's checkpoint was cited with every dvc.lock hash and "validation passed"."""
    if "train_run" not in prov or (model_run and model_run == prov["train_run"]):
        return prov
    why = ("a Hugging Face folder" if model_run is None else "a checkpoint of another training run") + \
        ": the pipeline's data lineage is not its own"
    return {**prov, "dvc_lock": {}, "dvc_lock_left_out": [], "validation": {}, "lineage": f"{path} is {why}"}


def lineage(results: dict, task: str | None = None, metric: str | None = None) -> list[str]:
    rows = [r for r in results["rows"] if (task is None or r["task"] == task) and (metric is None or r["metric"] == metric)]
    prov = results["provenance"]
    lines = [f"{r['task']} {r['shots']}-shot {r['metric']} = {r['value']:.4f} (n={r['n']})" for r in rows]
    git = prov["git"]
    lines.append(f"code: git {git['commit']}{' (uncommitted changes)' if git['dirty'] else ''}")
    ck = prov["checkpoint"]
    lines.append(f"model: {ck.get('path')}" + (f" step {ck['step']}, {ck.get('tokens')} training tokens"
                                                if ck.get("step") is not None else f" ({ck.get('source')})"))
    lines.append(f"params: sha256 {prov['params_sha256']}; Prefect flow run {prov['prefect_flow_run_id']}")
    for stage, outs in prov["dvc_lock"].items():
        v = prov["validation"].get(stage, {})
        for path, md5 in outs.items():
            outcome = {True: "passed", False: "FAILED"}.get(v.get("success"), "not recorded (no suite)"
                                                             if stage == "sample" else "not recorded")
            lines.append(f"data: {stage} {path} md5 {md5}; validation {outcome}"
                         f"{' ' + v['data_docs'] if v.get('data_docs') else ''}")
    if prov.get("lineage"):
        lines.append(f"data: unknown ({prov['lineage']})")
    for stage in prov.get("dvc_lock_left_out", []):
        lines.append(f"data: {stage} not recorded in dvc.lock: its code changed while the run was under way")
    return lines


def read_results(path: Path) -> dict:
    """An evaluation's results.json (the stage's, or `tasks.evaluate.run`'s); anything else is one line."""
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file (an evaluation's results.json)") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: a folder, not an evaluation's results.json") from None
    except ValueError as e:  # UnicodeDecodeError too
        raise InputFileError(f"{path}: not JSON ({e})") from None
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        raise InputFileError(f"{path}: not an evaluation's results.json (it has no rows)")
    return results


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        results = read_results(Path(argv[0]))
    except PipelineError as e:
        code, line = describe(e)
        print(line, file=sys.stderr)
        return code
    for key, wanted in zip(("task", "metric"), argv[1:3]):  # the metric among the chosen task's rows
        known = sorted({r[key] for r in results["rows"] if key == "task" or r["task"] == argv[1]})
        if wanted not in known:
            print(f"usage error: no {key} {wanted!r} in {argv[0]} ({key}s: {', '.join(known)})", file=sys.stderr)
            return 2
    print("\n".join(lineage(results, *(argv[1:3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
