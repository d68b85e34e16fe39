"""The stage registry and the one entry point every orchestrator calls.

`run_stage(name, params)` runs a stage end to end (plan, shards, stats.json); `dvc repro` reaches it
through `python -m tasks <stage>`, Prefect through flows/, both with the same params model. Only
the way shards are mapped differs: sequentially here, through a Prefect task runner in flows/.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

from tasks import decontaminate, download, extract
from tasks.config import PipelineParams
from tasks.sample import generate
from tasks.shards import Shard, StageLayout, finalize, run_shard

# DAG order. Later stages (filter, dedup, blend, ...) register here.
PIPELINE: tuple[str, ...] = ("sample", "download", "extract", "decontaminate")
SHARDED: dict[str, ModuleType] = {"download": download, "extract": extract, "decontaminate": decontaminate,
                                  decontaminate.CountPass.NAME: decontaminate.CountPass}

MapShards = Callable[[str, PipelineParams, list[Shard], dict], list[dict]]


def process_shard(stage: str, p: PipelineParams, shard: Shard, rt: dict) -> dict:
    """Run one shard of a stage (picklable: process and Dask workers call this too)."""
    mod = SHARDED[stage]
    layout = StageLayout(p.paths.data_dir, getattr(mod, "LAYOUT", stage))
    return run_shard(layout, shard, lambda s, tmp: mod.process(s, tmp, p, rt), mod.stage_params(p))


def map_sequential(stage: str, p: PipelineParams, shards: list[Shard], rt: dict) -> list[dict]:
    return [process_shard(stage, p, s, rt) for s in shards]


def run_sample(p: PipelineParams) -> dict:
    return {"stage": "sample", **generate(p.sample, Path(p.paths.data_dir) / "sample", p.paths.benchmarks_dir)}


def run_stage(stage: str, p: PipelineParams, map_shards: MapShards = map_sequential) -> dict:
    if stage == "sample":
        return run_sample(p)
    if stage not in SHARDED:
        raise KeyError(f"unknown stage {stage!r}; stages: {', '.join(PIPELINE)}")
    mod = SHARDED[stage]
    layout = StageLayout(p.paths.data_dir, stage)
    layout.prepare()
    start = time.perf_counter()
    runtime = getattr(mod, "runtime", None)
    with (runtime(p) if runtime else contextlib.nullcontext({})) as rt:
        shards = mod.plan(p, rt, layout)
        if hasattr(mod, "first_pass"):  # e.g. decontamination's document-frequency count
            rt = mod.first_pass(p, rt, layout, shards, map_shards)
        parts = map_shards(stage, p, shards, rt)
    report = getattr(mod, "report", None)
    return finalize(layout, shards, parts, time.perf_counter() - start,
                    report=(lambda stats: report(rt, stats)) if report else None)
