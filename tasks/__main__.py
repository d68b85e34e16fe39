"""`python -m tasks <stage> [--params params.yaml]`: the entry point `dvc repro` runs.

Runs one stage on params.yaml, then its expectation suite. Exit status 2 for a configuration
error, 3 for a failed expectation, 4 when the input stage has not completed, 1 for anything else
that stopped the stage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    from tasks.core.config import load_params
    from tasks.core.errors import ConfigError, UnfinishedInput
    from tasks.core.registry import PIPELINE
    from tasks.core.runner import run_stage
    from tasks.validation import ExpectationFailed, validate_stage

    ap = argparse.ArgumentParser(prog="python -m tasks", description=__doc__)
    ap.add_argument("stage", choices=PIPELINE)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    try:
        params = load_params(args.params)
        stats = run_stage(args.stage, params)
        report = validate_stage(args.stage, params)
    except ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return 2
    except UnfinishedInput as e:
        print(f"unfinished input: {e}", file=sys.stderr)
        return 4
    except ExpectationFailed as e:
        print(f"validation failed: {e}", file=sys.stderr)
        return 3
    summary = {k: stats[k] for k in ("stage", "shards", "docs_in", "docs_out", "dropped") if k in stats}
    if report is not None:
        summary["validation"] = {"batches": report.batches, "docs": report.docs}
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
