"""One Prefect flow per stage, generated from the registry (tasks.core.registry): each is a thin
shell around tasks.core.runner.run_stage. A sharded pass's shards run as Prefect tasks through the
configured task runner; then the stage's expectation suite runs and its stats land as an artifact.
Parameters are the typed models from params.yaml."""
from __future__ import annotations

import json

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from flows.artifacts import publish
from flows.runners import build_task_runner
from tasks.core.config import PipelineParams, load_params
from tasks.core.errors import describe
from tasks.core.passes import Shard
from tasks.core.registry import STAGES
from tasks.core.runner import process_shard, run_stage
from tasks.core.stage import Context, Stage
from tasks.validation import ExpectationFailed, validate_stage


@task(name="shard", task_run_name="{stage}.{pass_name}:{shard.name}", cache_policy=NO_CACHE, persist_result=False)
def shard_task(stage: str, pass_name: str, params: PipelineParams, shard: Shard, ctx: Context) -> dict:
    return process_shard(stage, pass_name, params, shard, ctx)


def map_with_prefect(stage: str, pass_name: str, p: PipelineParams, shards: list[Shard], ctx: Context) -> list[dict]:
    with build_task_runner(p.runner) as runner:
        futures = [runner.submit(shard_task, {"stage": stage, "pass_name": pass_name, "params": p, "shard": s,
                                              "ctx": ctx}) for s in shards]
        return [f.result() for f in futures]


def resolve(params: PipelineParams | None, params_file: str) -> PipelineParams:
    return params if params is not None else load_params(params_file)


def run_stage_flow(stage: str, p: PipelineParams) -> dict:
    log = get_run_logger()
    stats = run_stage(stage, p, map_shards=map_with_prefect)
    try:
        report = validate_stage(stage, p)
    except ExpectationFailed as e:
        publish(stats, None, failure=str(e))
        raise
    publish(stats, report)
    log.info("%s: %s", stage, json.dumps({k: stats.get(k) for k in ("docs_in", "docs_out", "dropped")}))
    return stats


def failed(e: Exception) -> State:
    """The run fails with the same one line `python -m tasks` prints; the traceback goes to the
    run's debug log."""
    _, line = describe(e)
    log = get_run_logger()
    log.debug("traceback", exc_info=e)
    log.error(line)
    return Failed(message=line)


def _stage_flow(st: Stage):
    def stage_flow(params: PipelineParams | None = None, params_file: str = "params.yaml") -> dict:
        try:
            return run_stage_flow(st.name, resolve(params, params_file))
        except Exception as e:
            return failed(e)

    stage_flow.__name__ = stage_flow.__qualname__ = f"{st.name}_flow"
    stage_flow.__doc__ = st.doc
    return flow(name=f"stage-{st.name}", description=st.doc)(stage_flow)


STAGE_FLOWS = {st.name: _stage_flow(st) for st in STAGES}
