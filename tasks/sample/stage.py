"""Stage `sample`: one global pass that writes the built-in mini-crawl to data/sample/corpus."""
from __future__ import annotations

from pathlib import Path

from tasks.core.config import PipelineParams
from tasks.core.stage import Context, GlobalPass, Stage, fixed
from tasks.evalsets.loaders import TASK_NAMES, check_task_files, task_files
from tasks.sample.generate import generate


def _params(p: PipelineParams) -> dict:
    return {**p.sample.model_dump(mode="json"), "benchmarks_dir": p.paths.benchmarks_dir}


def _build(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    return generate(p.sample, tmp, p.paths.benchmarks_dir)


STAGE = Stage(
    code=("tasks/sample", "tasks/evalsets"),  # dvc.yaml deps
    name="sample", section="sample", input=fixed(None),
    doc="Generate the built-in mini-crawl (Common Crawl layout) and its ground truth.",
    passes=(GlobalPass("corpus", build=_build, params=_params,
                       inputs=lambda p, ctx: task_files(p.paths.benchmarks_dir)),),
    other_inputs=lambda p, ctx: task_files(p.paths.benchmarks_dir),
    check=lambda p, ctx: check_task_files(TASK_NAMES, p.paths.benchmarks_dir),  # it plants each task's passages
)
