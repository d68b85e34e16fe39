"""The `pretraining-pipeline` flow: every stage in DAG order, each validated before the next.

Triggered from the Prefect UI through the deployment in prefect.yaml, or run directly:
`python -m flows.pipeline` (with no server configured Prefect starts a temporary local one).
"""
from __future__ import annotations

import os
import sys

from prefect import flow, get_run_logger

from flows.dvc_sync import record_in_dvc
from flows.stages import STAGE_FLOWS, resolve
from tasks.core.config import PipelineParams
from tasks.core.registry import PIPELINE


@flow(name="pretraining-pipeline")
def pretraining_pipeline(params: PipelineParams | None = None, params_file: str = "params.yaml",
                         stages: list[str] | None = None) -> dict:
    """Run the pipeline DAG (all stages, or the named ones in DAG order) on params.yaml or `params`."""
    p = resolve(params, params_file)
    chosen = [s for s in PIPELINE if stages is None or s in stages]
    unknown = set(stages or []) - set(PIPELINE)
    if unknown:
        raise ValueError(f"unknown stage(s) {sorted(unknown)}; stages: {', '.join(PIPELINE)}")
    results = {s: STAGE_FLOWS[s](params=p, params_file=params_file) for s in chosen}
    get_run_logger().info(record_in_dvc(chosen, p, params_file))
    return results


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = pretraining_pipeline(params_file=sys.argv[1] if len(sys.argv) > 1 else "params.yaml")
    print({s: {k: v.get(k) for k in ("docs_in", "docs_out")} for s, v in out.items()})
