"""End-to-end determinism: the whole DAG twice, in two folders, on the same params and seed.

    python -m benchmarks.determinism [--keep DIR]

Copies the project (the files git tracks or would track) into two folders at different paths, runs the
pipeline of `make run` (`python -m flows.pipeline params.yaml`, each with its own temporary Prefect
server) in one, then in the other, and compares every file under data/ byte for byte.

Run records may differ, and are counted apart with the reason (RUN_RECORDS): timings, validation
times, launch logs. Everything else (shards, their completion markers, aside shards, the quality
classifier, plots, tokenizer, token datasets, blend, checkpoints, the Hugging Face export, the
evaluation's metrics and report) is a data file and must be byte-identical;
so must the deterministic parts of two records: the loss column of the training metrics, and the
evaluation's rows and generations in results.json.
The last line is `determinism_identical_data_files=<k>/<n> run_records=<r> unexpected_differences=<m>`.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# (pattern under data/, why the file may differ between two runs of the same inputs)
RUN_RECORDS = (
    ("*stats.json", "a stage's report: seconds and throughput"),
    ("docs/*", "Data Docs: each validation's run time and id"),
    ("*.done.json", "a global pass's marker: its report may hold timings (training throughput, evaluation seconds)"),
    ("train/work/launch.log", "the training launch's log: ports, pids, times"),
    ("train/work/deepspeed_env", "the launch's environment file: the launcher's pid and start time"),
    ("train/work/run.json", "the training run's settings: absolute paths of its input folders"),
    ("train/work/progress.json", "the training progress: times and throughput"),
    ("train/*/metrics.csv", "per-step throughput columns (the loss column is compared)"),
    ("train/model/train_report.json", "throughput (the losses are compared)"),
    ("evaluate/results/results.json", "seconds and provenance: the hashes of the records above (rows compared)"),
    ("*.lock", "a lock file"),
    (".input-hashes/*", "a remembered hash of an input: its absolute path, mtime and inode"),
)


def record_reason(rel: str) -> str | None:
    return next((why for pattern, why in RUN_RECORDS if fnmatch.fnmatch(rel, pattern)), None)


def copy_project(dest: Path) -> Path:
    """The project's files as a clean clone has them, plus numba's on-disk cache (valid in the copy
    while each source keeps its size and mtime, which copy2 keeps)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    files = [f for f in listed if (REPO / f).is_file()]
    files += [str(f.relative_to(REPO)) for f in REPO.glob("tasks/**/__pycache__/*.nb[ic]")]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    # the evaluation sets sit beside the project (a relative paths.benchmarks_dir): the copies use this one's
    params = yaml.safe_load((dest / "params.yaml").read_text(encoding="utf-8"))
    params["paths"]["benchmarks_dir"] = str((REPO / params["paths"]["benchmarks_dir"]).resolve())
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)  # as a clone is: DVC records the run in dvc.lock
    return dest


def run_pipeline(project: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # a temporary server per run
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR=env.get("DS_ACCELERATOR", "cpu"), DVC_NO_ANALYTICS="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", GX_ANALYTICS_ENABLED="False",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    start = time.perf_counter()
    with open(project / "pipeline.log", "wb") as log:
        code = subprocess.run([sys.executable, "-m", "flows.pipeline", "params.yaml"], cwd=project, env=env,
                              stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"the pipeline failed in {project} (exit {code}): see {project / 'pipeline.log'}")
    return time.perf_counter() - start


def tree(root: Path) -> dict[str, Path]:
    return {str(f.relative_to(root)): f for f in sorted(root.rglob("*")) if f.is_file()}


def loss_column(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return [row["loss"] for row in csv.DictReader(f)]


def record_parts(rel: str, path: Path):
    """The deterministic part of a run record, or None where the whole record is run-dependent."""
    if rel.endswith("metrics.csv"):
        return loss_column(path)
    if rel == "train/model/train_report.json":
        report = json.loads(path.read_text(encoding="utf-8"))
        return [report["first_loss"], report["final_loss"], report["loss_curve"], report["steps"], report["tokens"]]
    if rel == "evaluate/results/results.json":
        results = json.loads(path.read_text(encoding="utf-8"))
        return [results["rows"], results["generations"]]
    return None


def compare(a: Path, b: Path) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(identical data files, data files that differ or exist in one run only, run records by reason)."""
    ta, tb = tree(a), tree(b)
    same, differ, records = [], [], {}
    for rel in sorted(set(ta) | set(tb)):
        why = record_reason(rel)
        if rel not in ta or rel not in tb:
            (records.setdefault(why, []) if why else differ).append(
                rel if why else f"{rel} (only in run {'1' if rel in ta else '2'})")
            continue
        identical = ta[rel].read_bytes() == tb[rel].read_bytes()
        if why:
            records.setdefault(why, []).append(rel)
            if identical:
                records.setdefault("(of which identical in both runs)", []).append(rel)
            elif record_parts(rel, ta[rel]) != record_parts(rel, tb[rel]):
                differ.append(f"{rel} (its deterministic part)")
        else:
            (same if identical else differ).append(rel)
    return same, differ, records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="determinism-"))
    try:
        runs = []
        for name in ("first", "second-run-elsewhere"):  # two paths of different lengths
            shutil.rmtree(base / name, ignore_errors=True)
            project = copy_project(base / name)
            seconds = run_pipeline(project)
            print(f"run {len(runs) + 1} in {project}: {seconds:.1f} s", flush=True)
            runs.append(project)
        same, differ, records = compare(runs[0] / "data", runs[1] / "data")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\ndata files byte-identical: {len(same)} of {len(same) + len(differ)}")
    for rel in differ:
        print(f"  DIFFERS: {rel}")
    print("run records (may differ; their deterministic parts compared above):")
    for why, rels in sorted(records.items(), key=lambda kv: kv[0].startswith("(")):  # "(of which ...)" last
        print(f"  {len(rels):4d}  {why}")
    n_records = sum(len(r) for why, r in records.items() if not why.startswith("("))
    print(f"determinism_identical_data_files={len(same)}/{len(same) + len(differ)} "
          f"run_records={n_records} unexpected_differences={len(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
