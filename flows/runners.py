"""Build the Prefect task runner that maps a stage's shards, from the typed runner params."""
from __future__ import annotations

from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

from tasks.core.config import RunnerParams


def build_task_runner(r: RunnerParams):
    if r.kind == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    if r.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=r.max_workers)
    if r.kind == "processes":
        return ProcessPoolTaskRunner(max_workers=r.max_workers)
    from prefect_dask import DaskTaskRunner

    if r.dask_address:  # an existing cluster: Prefect only submits to it
        return DaskTaskRunner(address=r.dask_address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": r.max_workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None})
