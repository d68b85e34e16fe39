"""Build the Prefect task runner that maps a stage's shards, from the typed runner params."""
from __future__ import annotations

from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

from tasks.core.config import RunnerParams
from tasks.core.errors import ConfigError

CONNECT_WITHIN_S = 10.0


def check_reachable(r: RunnerParams) -> None:
    """An existing Dask scheduler answers, before a stage changes anything: unreachable, the stage's first
    pass failed after 30 s with 'OSError: Timed out trying to connect', naming no key, its last completion
    (stats.json) already gone (an operator drill)."""
    import socket
    from urllib.parse import urlsplit

    if r.kind != "dask" or not r.dask_address:
        return
    where = urlsplit(r.dask_address if "://" in r.dask_address else f"tcp://{r.dask_address}")
    try:
        socket.create_connection((where.hostname, where.port or 8786), timeout=CONNECT_WITHIN_S).close()
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise ConfigError(f"runner.dask_address {r.dask_address}: cannot connect to the Dask scheduler ({why})") \
            from None


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
