"""One Prefect flow per stage, generated from the registry (tasks.core.registry): each is a thin
shell around tasks.core.runner.run_stage. A sharded pass's shards run as Prefect tasks through the
configured task runner; then the stage's expectation suite runs and its stats land as an artifact.
Parameters are the typed models from params.yaml."""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from queue import Empty, SimpleQueue

from prefect import flow, get_run_logger, task
from pydantic import BaseModel
from prefect.cache_policies import NO_CACHE
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.states import Failed, State
from tqdm import tqdm

from flows.artifacts import publish
from flows.runners import build_task_runner, check_reachable
from tasks.core import notices
from tasks.core.shard_threads import WAKE_S, ShardThreads, running_shard
from tasks.core.config import PipelineParams, load_params
from tasks.core.errors import ConfigError, describe, naming_full_disk
from tasks.core.passes import Shard
from tasks.core.registry import STAGES
from tasks.core.runner import process_shard, run_stage, stage_lock, stats_path
from tasks.core.stage import Context, Stage
from tasks.validation import ExpectationFailed, recorded_validation_stands, validation_of


@task(name="shard", task_run_name="{stage}.{pass_name}:{shard.name}", cache_policy=NO_CACHE, persist_result=False)
def shard_task(stage: str, pass_name: str, params: PipelineParams, shard: Shard, ctx: Context) -> dict:
    with running_shard():  # an interrupt of the run reaches it (tasks/core/shard_threads.py)
        return process_shard(stage, pass_name, params, shard, ctx)


def map_with_prefect(stage: str, pass_name: str, p: PipelineParams, shards: list[Shard], ctx: Context) -> list[dict]:
    """Shards as Prefect tasks; progress as a Prefect progress artifact and a console bar."""
    if not shards:
        return []
    progress = create_progress_artifact(0.0, description=f"{stage}: pass {pass_name}, {len(shards)} shards")
    with build_task_runner(p.runner) as runner, ShardThreads().mapping(), \
            tqdm(total=len(shards), desc=f"{stage}.{pass_name}", unit="shard", disable=None) as bar:
        futures = [runner.submit(shard_task, {"stage": stage, "pass_name": pass_name, "params": p, "shard": s,
                                              "ctx": ctx}) for s in shards]
        finished: SimpleQueue = SimpleQueue()
        for f in futures:
            f.add_done_callback(finished.put)
        for done in range(1, len(futures) + 1):
            # in short waits, as the command's mapper waits (WAKE_S): a signal the kernel delivers to a shard's
            # thread runs its handler in this, the main, thread only once it wakes, and in Prefect's
            # as_completed (one untimed wait) a Ctrl-C went unseen until a shard ended
            while not _took(finished):
                pass
            bar.update(1)
            update_progress_artifact(progress, 100.0 * done / len(shards))
        return [f.result() for f in futures]


def _took(queue: SimpleQueue) -> bool:
    try:
        queue.get(timeout=WAKE_S)
        return True
    except Empty:
        return False


def params_yaml_defaults() -> tuple[PipelineParams, ConfigError | None]:
    """params.yaml as the flows' default `params`: read when this module is imported, so the UI's
    custom-run form opens filled in (at deploy time) and a quick run reads it fresh (each run of a
    process worker starts a new process). Unreadable: the models' defaults, and why (resolve refuses
    a run that would take them for params.yaml's)."""
    try:
        return load_params("params.yaml"), None
    except ConfigError as e:
        return PipelineParams(), e


DEFAULT_PARAMS, PARAMS_YAML_ERROR = params_yaml_defaults()


def resolve(params: PipelineParams, params_file: str | None) -> PipelineParams:
    """The run's parameters: `params_file` read, else `params`. A quick run (the default params) while
    params.yaml does not read is refused with its error: it ran on the models' defaults, without a word
    (a 270-billion-token training run, moving the real run aside). A deployment's run given `params` (the UI's
    custom-run form) takes params.yaml's value for every field it was not given (filled_from)."""
    if params_file:
        return load_params(params_file)
    if PARAMS_YAML_ERROR is not None and params == DEFAULT_PARAMS:
        raise ConfigError(f"{PARAMS_YAML_ERROR} (a quick run reads params.yaml: fix it, or give the run its "
                          f"parameters)")
    if params != DEFAULT_PARAMS and _a_deployments_own_run():  # a quick run gets DEFAULT_PARAMS itself, unset fields and all
        params, filled = filled_from(DEFAULT_PARAMS, params)
        if filled:
            get_run_logger().warning("params: %d field(s) left empty take params.yaml's value: %s", len(filled),
                                     ", ".join(filled))
    if why := params.across_sections():  # after the form's empty fields took params.yaml's values
        raise ConfigError(f"params: {why}")
    return params


def _a_deployments_own_run() -> bool:
    """A flow run a deployment started, not a stage's run inside the pipeline's (which gets the pipeline's whole
    parameters: a params file's unset fields are its models' defaults, as a command's)."""
    from prefect.context import FlowRunContext
    ctx = FlowRunContext.get()
    return ctx is not None and ctx.flow_run.deployment_id is not None and ctx.flow_run.parent_task_run_id is None


def filled_from(defaults: PipelineParams, given: PipelineParams) -> tuple[PipelineParams, list[str]]:
    """`given`, with each field it was not given taken from `defaults`, and those fields' names. The UI's form
    leaves out a number field that was emptied, or given letters (the browser keeps ''): pydantic then filled
    in the model's default, not the params.yaml value the form showed (4 WARC files for 2, every evaluation
    doc for 3), without a word."""
    filled: list[str] = []

    def merged(d, g, prefix: str) -> dict:
        out = {}
        for name in type(g).model_fields:
            if name not in g.model_fields_set:
                filled.append(prefix + name)
                out[name] = getattr(d, name)
            elif isinstance(value := getattr(g, name), BaseModel) and type(value) is type(getattr(d, name)):
                out[name] = merged(getattr(d, name), value, f"{prefix}{name}.")
            elif isinstance(value, dict) and isinstance(known := getattr(d, name), dict):
                # a dict of models (train.profiles): an entry params.yaml has too is filled from it
                out[name] = {k: merged(known[k], v, f"{prefix}{name}.{k}.")
                             if isinstance(v, BaseModel) and type(v) is type(known.get(k)) else v for k, v in value.items()}
            else:
                out[name] = value
        return out
    values = merged(defaults, given, "")
    if not filled:
        return given, []
    # validated again, whole: the checks across sections see the merged values
    return PipelineParams.model_validate(_dumped(values)), filled


def _dumped(values):
    if isinstance(values, BaseModel):
        return values.model_dump(mode="json")
    if isinstance(values, dict):
        return {k: _dumped(v) for k, v in values.items()}
    return values


def run_stage_flow(stage: str, p: PipelineParams) -> dict:
    log = get_run_logger()
    from prefect.runtime import flow_run
    if flow_run.id:  # the stage's outputs record the flow run that made them (evaluation provenance)
        os.environ["PREFECT__FLOW_RUN_ID"] = str(flow_run.id)
    check_reachable(p.runner)  # before the stage changes anything
    with naming_full_disk(p.paths.data_dir), stage_lock(p, stage), notices.forwarded_to(log.warning):
        with watching(next(st for st in STAGES if st.name == stage), p):
            stats = run_stage(stage, p, map_shards=map_with_prefect, validation_follows=True,
                              skip_up_to_date=recorded_validation_stands(stage, p))
        for line in stats.get("warnings", []):  # before the validation, whose failure they may explain
            log.warning("%s: %s", stage, line)
        try:
            report = validation_of(stage, p, stats)
        except ExpectationFailed as e:
            publish(_with_validation(stats, p), e.report, p, failure=describe(e)[1])
            raise
    stats = _with_validation(stats, p)
    artifact = publish(stats, report, p)
    counts = {k: stats[k] for k in ("docs_in", "docs_out", "dropped") if k in stats}  # document stages only
    if stats.get("up_to_date"):
        log.info("%s: up to date (its code, parameters and inputs are those of the run that made its outputs, "
                 "and they are whole): not run again%s", stage, f"; {json.dumps(counts)}" if counts else "")
    else:
        log.info("%s: %s", stage, json.dumps(counts) if counts else f"done in {stats.get('wall_seconds')} s")
    return {**stats, "artifact": str(artifact)}


@contextlib.contextmanager
def watching(st: Stage, p: PipelineParams, poll_s: float = 2.0, log_s: float = 10.0):
    """While a stage with declared progress runs (a training run): a Prefect progress artifact updated
    every `poll_s` and its line in the run's log every `log_s` (the first and the last always)."""
    if st.progress is None:
        yield
        return
    log, since, stop = get_run_logger(), time.time(), threading.Event()
    seen = {"got": None, "logged": None, "at": 0.0, "artifact": None}

    def poll(final: bool = False) -> None:
        got = st.progress(p, since)
        if got is not None and got != seen["got"]:
            seen["got"] = got
            if seen["artifact"] is None:  # made once the run has begun: a stage found up to date gets none
                seen["artifact"] = create_progress_artifact(0.0, description=f"{st.name}: progress of the run")
            update_progress_artifact(seen["artifact"], 100.0 * got[0])
        got = seen["got"]
        due = final or seen["logged"] is None or time.monotonic() - seen["at"] >= log_s
        if got is not None and got != seen["logged"] and due:
            log.info(got[1])
            seen["logged"], seen["at"] = got, time.monotonic()

    def safe_poll(final: bool = False) -> None:
        try:
            poll(final)
        except Exception as e:  # noqa: BLE001 - a missed update must not stop the watch or the stage
            log.debug("progress update failed: %s", e)

    def watch() -> None:
        while not stop.wait(poll_s):
            safe_poll()

    thread = threading.Thread(target=contextvars.copy_context().run, args=(watch,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        safe_poll(final=True)  # the last step's numbers, whatever the timing


def _with_validation(stats: dict, p: PipelineParams) -> dict:
    """stats.json as validation left it (it records its result and seconds there), and whether the stage was
    found up to date (run_stage says so in what it returns, not in stats.json)."""
    path = stats_path(p, stats["stage"])
    found = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else stats
    return {**found, "up_to_date": True} if stats.get("up_to_date") else found


def failed(e: Exception) -> State:
    """The run fails with the same one line `python -m tasks` prints; the traceback goes to the
    run's debug log."""
    _, line = describe(e)
    log = get_run_logger()
    log.debug("traceback", exc_info=e)
    log.error(line)
    return Failed(message=line)


def _stage_flow(st: Stage):
    def stage_flow(params: PipelineParams = DEFAULT_PARAMS, params_file: str | None = None) -> dict:
        try:
            return run_stage_flow(st.name, resolve(params, params_file))
        except Exception as e:
            return failed(e)

    stage_flow.__name__ = stage_flow.__qualname__ = f"{st.name}_flow"
    stage_flow.__doc__ = f"""{st.doc}

    Args:
        params: Every pipeline parameter; the form opens with params.yaml's values.
        params_file: A params file to read instead of `params` (leave empty to use `params`).
    """
    return flow(name=f"stage-{st.name}", description=st.doc)(stage_flow)


STAGE_FLOWS = {st.name: _stage_flow(st) for st in STAGES}

