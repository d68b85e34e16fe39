"""The `pretraining-pipeline` flow: every stage in DAG order, each validated before the next.

Triggered from the Prefect UI through the deployment in prefect.yaml, or run directly:
`python -m flows.pipeline` (with no server configured Prefect starts a temporary local one).
"""
from __future__ import annotations

import os
import sys

from prefect import flow, get_run_logger
from prefect.states import Failed

from flows.dvc_sync import record_in_dvc
from flows.stages import STAGE_FLOWS, failed, resolve
from tasks.core.config import PipelineParams, load_params
from tasks.core.errors import ConfigError, describe, exit_code_of
from tasks.core.registry import PIPELINE


@flow(name="pretraining-pipeline")
def pretraining_pipeline(params: PipelineParams | None = None, params_file: str = "params.yaml",
                         stages: list[str] | None = None) -> dict:
    """Run the pipeline DAG (all stages, or the named ones in DAG order) on params.yaml or `params`."""
    try:
        p = resolve(params, params_file)
        unknown = set(stages or []) - set(PIPELINE)
        if unknown:
            raise ConfigError(f"unknown stage(s) {sorted(unknown)}; stages: {', '.join(PIPELINE)}")
        chosen = [s for s in PIPELINE if stages is None or s in stages]
        results = {}
        for s in chosen:
            state = STAGE_FLOWS[s](params=p, params_file=params_file, return_state=True)
            if not state.is_completed():  # the stage's one line becomes the pipeline's state message
                get_run_logger().error("stage %s: %s", s, state.message)
                return Failed(message=state.message)
            results[s] = state.result()
        get_run_logger().info(record_in_dvc(chosen, p, params_file))
        return results
    except Exception as e:
        return failed(e)


def main(argv: list[str]) -> int:
    params_file = argv[0] if argv else "params.yaml"
    try:
        load_params(params_file)  # a bad file fails before any Prefect server starts
    except ConfigError as e:
        print(describe(e)[1], file=sys.stderr)
        return 2
    state = pretraining_pipeline(params_file=params_file, return_state=True)
    if not state.is_completed():
        print(state.message, file=sys.stderr)
        return exit_code_of(state.message or "")
    out = state.result()
    print({s: {k: v.get(k) for k in ("docs_in", "docs_out")} for s, v in out.items()})
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
