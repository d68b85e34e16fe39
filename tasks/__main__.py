"""`python -m tasks <stage> [--params params.yaml]`: the entry point `dvc repro` runs.

Runs one stage on params.yaml, then its expectation suite. Any error is one line on stderr (with
the traceback only under --verbose) and an exit status: 2 bad configuration or input files,
3 failed expectation, 4 unfinished input stage, 1 anything else.
"""
from __future__ import annotations

import os
import sys

# Run from inside tasks/ itself, `python -m` puts this folder first on sys.path, and tasks/tokenize
# then stands in for Python's tokenize (which traceback imports below): every stage failed with
# "module 'tokenize' has no attribute 'tokenize'". The package is found through its parent.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402 - after the sys.path repair above
import json  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    from tasks.core import interrupts
    from tasks.core.errors import describe, naming_params

    ap = argparse.ArgumentParser(prog="python -m tasks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", help="a stage of the DAG (tasks/core/registry.py)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--verbose", action="store_true", help="print the traceback of an error too")
    args = ap.parse_args(argv)
    stopped = f"interrupted: stage '{args.stage}' stopped; rerun it to resume"
    try:
        from tasks.core.config import enter_project
        summary = run(args.stage, enter_project(args.params))
    except Exception as e:  # every error ends as one line and its exit code (README: exit codes)
        if interrupts.requested():  # a Ctrl-C that an import turned into an error (ImportError: ... failed)
            return interrupts.interrupted(stopped)
        code, line = describe(e)
        line = naming_params(line, args.params)  # the hint to run an input stage names the same file
        if args.verbose:
            traceback.print_exc()
        print(line, file=sys.stderr)
        return code
    except KeyboardInterrupt:  # Ctrl-C: finished shards stay done, the rest is redone by the next run
        return interrupts.interrupted(stopped)
    print(json.dumps(summary, sort_keys=True))
    return 0


def run(stage: str, params_file: str) -> dict:
    from tasks.core import interrupts, lifeline, registry
    from tasks.core.config import load_params, untracked_data_dir
    from tasks.core.errors import CodeChanged, ConfigError, naming_full_disk
    from tasks.core.source import changed_since_loaded, loaded_code_digest
    from tasks.core.registry import PIPELINE
    from tasks.core.runner import VALIDATION_CODE, run_stage, stage_lock
    from tasks.validation import recorded_validation_stands, validation_of

    if stage not in PIPELINE:
        raise ConfigError(f"unknown stage {stage!r}; stages: {', '.join(PIPELINE)}")
    loaded_code_digest(registry.stage(stage).code)  # imported above: the code it runs (input checks take time)
    loaded_code_digest((VALIDATION_CODE,))
    params = load_params(params_file)
    # under dvc repro (run in the project's folder): the stage would run, and DVC then fail on its outputs
    if os.environ.get("DVC_STAGE") and (why := untracked_data_dir(params.paths.data_dir, Path.cwd())):
        raise ConfigError(f"{why}: `dvc repro` needs data_dir: data, inside the repository (`make run` takes "
                          f"any data_dir, and does not record it in dvc.lock)")
    # the limit after Ctrl-C: a shard blocked in a stalled download needs up to its timeout
    interrupts.install(interrupts.EXIT_WITHIN_S + params.download.timeout_s)
    dvc = lifeline.ancestor_running("dvc") if os.environ.get("DVC_STAGE") else None
    if dvc is not None:  # run by `dvc repro`, which cannot record what the stage does once it is gone
        lifeline.stop_when_gone(dvc, f"stage '{stage}': dvc repro, which ran it, is gone (killed?); stopping it")
    with naming_full_disk(params.paths.data_dir), stage_lock(params, stage):
        lifeline.guard_descendants()  # what the stage starts (sandboxed extraction, ranks) ends with it
        stats = run_stage(stage, params, shard_mapper(params.runner), validation_follows=True,
                          skip_up_to_date=recorded_validation_stands(stage, params))
        for line in stats.get("warnings", []):  # before the validation, whose failure they may explain
            print(f"warning: {line}", file=sys.stderr)
        report = validation_of(stage, params, stats)
    code = registry.stage(stage).code
    if changed_since_loaded(code):  # a failed command is one DVC does not record in dvc.lock
        raise CodeChanged(f"stage '{stage}' ran with the code it loaded, and its code changed on disk meanwhile: "
                          f"its outputs are the old code's, so this run must not be recorded; rerun `python -m "
                          f"tasks {stage}`")
    summary = {k: stats[k] for k in ("stage", "shards", "docs_in", "docs_out", "dropped", "up_to_date") if k in stats}
    if report is not None:
        summary["validation"] = {"batches": report.batches, "docs": report.docs}
    return summary


def shard_mapper(r):
    """How this command runs a pass's shards: in runner.max_workers threads, one after another for kind
    sequential. The processes and dask runners are the Prefect flows' (their workers are Prefect's)."""
    from tasks.core.shard_threads import map_in_threads

    mapper = map_in_threads(1 if r.kind == "sequential" else r.max_workers)
    if r.kind in ("sequential", "threads"):
        return mapper
    said = False

    def noting(stage, pass_name, p, shards, ctx):  # said once, where it matters (not before a refusal)
        nonlocal said
        if len(shards) > 1 and not said:
            print(f"note: runner.kind {r.kind} applies to the Prefect flows; python -m tasks runs shards in "
                  f"{r.max_workers} threads", file=sys.stderr)
            said = True
        return mapper(stage, pass_name, p, shards, ctx)
    return noting


if __name__ == "__main__":
    from tasks.core import interrupts
    interrupts.install()  # first: Ctrl-C stops the stage wherever it lands, its imports included
    sys.exit(main())
