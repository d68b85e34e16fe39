"""One Prefect flow per stage. Each is a thin shell around tasks.stages.run_stage: the shards run
as Prefect tasks through the configured task runner, then the stage's expectation suite runs and
its stats land as an artifact. Parameters are the typed models from params.yaml."""
from __future__ import annotations

import json

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.artifacts import publish
from flows.runners import build_task_runner
from tasks.config import PipelineParams, load_params
from tasks.shards import Shard
from tasks.stages import process_shard, run_stage
from tasks.validation import ExpectationFailed, validate_stage


@task(name="shard", task_run_name="{stage}:{shard.name}", cache_policy=NO_CACHE, persist_result=False)
def shard_task(stage: str, params: PipelineParams, shard: Shard, rt: dict) -> dict:
    return process_shard(stage, params, shard, rt)


def map_with_prefect(stage: str, p: PipelineParams, shards: list[Shard], rt: dict) -> list[dict]:
    with build_task_runner(p.runner) as runner:
        futures = [runner.submit(shard_task, {"stage": stage, "params": p, "shard": s, "rt": rt}) for s in shards]
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


@flow(name="stage-sample")
def sample_flow(params: PipelineParams | None = None, params_file: str = "params.yaml") -> dict:
    """Generate the built-in mini-crawl (Common Crawl layout) and its ground truth."""
    p = resolve(params, params_file)
    stats = run_stage("sample", p)
    publish(stats, None)
    return stats


@flow(name="stage-download")
def download_flow(params: PipelineParams | None = None, params_file: str = "params.yaml") -> dict:
    """Download WARC files (Common Crawl or the served sample) and ingest curated datasets."""
    return run_stage_flow("download", resolve(params, params_file))


@flow(name="stage-extract")
def extract_flow(params: PipelineParams | None = None, params_file: str = "params.yaml") -> dict:
    """WARC -> main text + language ID -> Parquet document shards."""
    return run_stage_flow("extract", resolve(params, params_file))


@flow(name="stage-decontaminate")
def decontaminate_flow(params: PipelineParams | None = None, params_file: str = "params.yaml") -> dict:
    """Remove evaluation-task 13-gram overlaps (GPT-3 App. C): count pass, then removal pass."""
    return run_stage_flow("decontaminate", resolve(params, params_file))


STAGE_FLOWS = {"sample": sample_flow, "download": download_flow, "extract": extract_flow,
               "decontaminate": decontaminate_flow}
