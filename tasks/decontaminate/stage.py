"""Stage `decontaminate`: remove evaluation-task n-gram overlaps from training documents.

GPT-3 Appendix C, as MT-NLG used it, as four declared passes:
  index     (global)  the task n-gram index, built from the evaluation-task files
  count     (sharded) per input shard, how many documents contain each task n-gram
  frequent  (global)  n-grams in more than `max_doc_frequency` documents: too common to mean
                      contamination, ignored
  remove    (sharded) each remaining match is cut out with a margin (tasks.decontaminate.removal)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tasks.core.config import PipelineParams
from tasks.core.identity import done_marker
from tasks.core.stage import Context, GlobalPass, ShardedPass, Stage
from tasks.decontaminate.counting import build_frequent, count_shard, plan_count
from tasks.decontaminate.matching import build_index, load_index
from tasks.decontaminate.ngram_index import HASH_VERSION, NgramIndex
from tasks.decontaminate.removal import plan_remove, remove_shard, report
from tasks.evalsets.loaders import check_task_files, task_files

NAME = "decontaminate"


def index_params(p: PipelineParams) -> dict:
    d = p.decontaminate
    return {"hash_version": HASH_VERSION, "tasks": list(d.tasks), "n": d.n, "min_n": d.min_n,
            "benchmarks_dir": p.paths.benchmarks_dir}


def count_params(p: PipelineParams) -> dict:
    return {"batch_docs": p.decontaminate.batch_docs}


def stage_params(p: PipelineParams) -> dict:
    return {**p.decontaminate.model_dump(mode="json"), "benchmarks_dir": p.paths.benchmarks_dir}


STAGE = Stage(
    code=("tasks/decontaminate", "tasks/evalsets"),  # dvc.yaml deps
    name=NAME, section="decontaminate", input=lambda p: p.decontaminate.input_stage,
    doc="Remove evaluation-task 13-gram overlaps (GPT-3 App. C): index, count, frequent, remove.",
    passes=(
        GlobalPass("index", build=lambda tmp, p, ctx: build_index(tmp, p), params=index_params,
                   inputs=lambda p, ctx: task_files(p.paths.benchmarks_dir)),
        ShardedPass("count", plan=plan_count, process=count_shard, params=count_params),
        GlobalPass("frequent", build=build_frequent, params=lambda p: {"max": p.decontaminate.max_doc_frequency}),
        ShardedPass("remove", plan=plan_remove, process=remove_shard, params=stage_params),
    ),
    suite="tasks.validation.decontaminate",
    report=report,
    other_inputs=lambda p, ctx: task_files(p.paths.benchmarks_dir),
    check=lambda p, ctx: check_task_files(p.decontaminate.tasks, p.paths.benchmarks_dir),
)


def finished_index(data_dir: str | Path) -> tuple[NgramIndex, np.ndarray]:
    """The index and the ignored (frequent) entries a finished run left on disk."""
    ctx = Context(NAME, str(data_dir))
    marker = done_marker(ctx.pass_dir("index"))
    digest = json.loads(marker.read_text(encoding="utf-8"))["digest"]
    return load_index(ctx.pass_dir("index"), digest), np.load(ctx.pass_dir("frequent") / "frequent.npy")
