"""The `pretraining-pipeline` flow: every stage in DAG order, each validated before the next.

Triggered from the Prefect UI through the deployment in prefect.yaml, or run directly:
`python -m flows.pipeline` (with no server configured Prefect starts a temporary local one).
"""
from __future__ import annotations

if __name__ == "__main__":  # a command: a Ctrl-C or SIGTERM during the imports below ends it with its line
    from flows.command_line import stop_during_imports
    stop_during_imports("interrupted: the pipeline stopped; rerun it to resume")

import json
import os
import sys
from typing import Literal

from prefect import flow, get_run_logger
from prefect.states import Failed

from flows.dvc_sync import record_in_dvc
from flows.artifacts import publish_summary
from flows import command_line
from flows.stages import DEFAULT_PARAMS, STAGE_FLOWS, failed, resolve
from tasks.core.config import PipelineParams, enter_project, load_params
from tasks.core.errors import ConfigError, describe, exit_code_of, naming_params
from tasks.core import interrupts, registry
from tasks.core.registry import PIPELINE
from tasks.core.runner import VALIDATION_CODE, stats_path
from tasks.core.source import loaded_code_digest


StageName = Literal[PIPELINE]  # the custom-run form offers the stage names


@flow(name="pretraining-pipeline")
def pretraining_pipeline(params: PipelineParams = DEFAULT_PARAMS, params_file: str | None = None,
                         stages: list[StageName] | None = None) -> dict:
    """Run the pipeline DAG: every stage in order, each validated before the next.

    Args:
        params: Every pipeline parameter; the form opens with params.yaml's values.
        params_file: A params file to read instead of `params` (leave empty to use `params`).
        stages: Run only these stages, in DAG order (leave empty for all).
    """
    interrupts.guard_flow_run()  # a deployment's run: a stop that a finalizer dropped is raised again
    rows: list[dict] = []
    p = params
    try:
        p = resolve(params, params_file)
        chosen = [s for s in PIPELINE if not stages or s in stages]
        for s in chosen:  # the code as loaded now, before a long run gives time to edit it (tasks.core.source)
            loaded_code_digest(registry.stage(s).code)
        loaded_code_digest((VALIDATION_CODE,))
        for i, s in enumerate(chosen):
            if registry.stage(s).cites_lineage and i:  # its provenance reads dvc.lock: record what is done
                get_run_logger().info(record_in_dvc(chosen[:i], p))
            before = _stats_stamp(p, s)
            state = STAGE_FLOWS[s](params=p, return_state=True)
            interrupts.raise_if_requested()  # a Ctrl-C as the stage's flow run ended, which Prefect drops
            if not state.is_completed():  # the stage's one line becomes the pipeline's state message
                rows.append({"stage": s, "error": state.message, "artifact": _stage_artifact(state, s),
                             "stats": _stats_or_none(p, s) if _stats_stamp(p, s) != before else None})
                get_run_logger().error("stage %s: %s", s, state.message)
                publish_summary(rows, p, f"failed at stage {s}")
                return Failed(message=state.message)
            stats = state.result()
            rows.append({"stage": s, "stats": stats, "artifact": stats.get("artifact")})
        get_run_logger().info(record_in_dvc(chosen, p))
        publish_summary(rows, p, "completed")
        return {r["stage"]: r["stats"] for r in rows}
    except Exception as e:
        return failed(e)


def _stats_stamp(p: PipelineParams, stage: str) -> tuple | None:
    """Which stats.json is there: a failed stage's row shows its stats only if this run wrote them (a failed
    validation); a stage that stopped before them left the previous run's, which the summary showed as this
    run's numbers, "passed"."""
    try:
        st = stats_path(p, stage).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _stage_artifact(state, stage: str) -> str | None:
    """The artifact a failed stage's flow run published (a failed validation's report), for the summary's
    link; None when it published none, or the server cannot say."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from flows.artifacts import artifact_key
    run_id = state.state_details.flow_run_id
    if run_id is None:
        return None
    try:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]), key=ArtifactFilterKey(any_=[artifact_key(stage, "stats")])),
                limit=1)
    except Exception as e:  # noqa: BLE001 - the summary goes out without the link rather than not at all
        get_run_logger().debug("the artifact of stage %s: %s", stage, e)
        return None
    return str(found[0].id) if found else None


def _stats_or_none(p: PipelineParams, stage: str) -> dict | None:
    path = stats_path(p, stage)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def main(argv: list[str]) -> int:
    """`python -m flows.pipeline [params.yaml [stage ...]]`: every stage, or only the named ones in DAG order."""
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: python -m flows.pipeline [params.yaml [stage ...]]\n\nRuns the pipeline DAG through "
              f"Prefect: every stage, or only the named ones in DAG order.\nstages: {', '.join(PIPELINE)}")
        return 0
    params_file, stages = (argv[0], argv[1:]) if argv else ("params.yaml", [])
    given = params_file
    try:
        params_file = enter_project(params_file)
        p = load_params(params_file)  # a bad file fails before any Prefect server starts
        unknown = [s for s in stages if s not in PIPELINE]
        if unknown:
            raise ConfigError(f"unknown stage {unknown[0]!r}: the stages are {', '.join(PIPELINE)}")
    except ConfigError as e:
        print(describe(e)[1], file=sys.stderr)
        return 2
    try:
        command_line.prepare(stop_within_s=interrupts.EXIT_WITHIN_S + p.download.timeout_s)
        state = pretraining_pipeline(params_file=params_file, stages=stages or None, return_state=True)
    except KeyboardInterrupt:  # Ctrl-C: finished shards and checkpoints stay, the rest is redone by a rerun
        return _interrupted()
    except Exception as e:  # noqa: BLE001 - Prefect itself failed (no API, a server too slow to start): one line
        code, line = describe(e)
        print(line + _prefect_hint(line), file=sys.stderr)
        return code
    if not state.is_completed():
        if interrupts.requested():  # a Ctrl-C that an import turned into a stage's error
            return _interrupted()
        print(naming_params(state.message or "", given), file=sys.stderr)  # as python -m tasks names it
        return exit_code_of(state.message or "")
    out = state.result()
    print({s: {k: v.get(k) for k in ("docs_in", "docs_out")} for s, v in out.items()})
    return 0


def _prefect_hint(line: str) -> str:
    if "ephemeral Prefect API server" in line:
        return " (a loaded machine starts it slowly: raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
    if (url := os.environ.get("PREFECT_API_URL")) and any(w in line for w in ("reach API", "onnect")):
        return f" (PREFECT_API_URL is {url}: start that server, `make ui`, or unset it for a temporary one)"
    return ""


def _interrupted() -> int:
    return interrupts.interrupted("interrupted: the pipeline stopped; rerun it to resume")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
