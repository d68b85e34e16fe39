"""Stage `evaluate`: the train stage's final checkpoint on the MT-NLG tasks, as one declared global pass.
  results (global)  scores every task in each shot setting (lm-evaluation-harness prompts and metrics),
                    generates from the report's prompts, and writes data/evaluate/results/:
                    results.json (rows + provenance), metrics.json (DVC metrics), report.md (Figure 3).
"""
from __future__ import annotations

from pathlib import Path

from tasks.core.config import PipelineParams
from tasks.core.stage import Context, GlobalPass, Stage
from tasks.evalsets.loaders import task_files

NAME = "evaluate"


def model_files(ctx: Context) -> tuple[Path, Path]:
    data = Path(ctx.data_dir)
    return data / "train" / "model" / "checkpoint", data / "tokenize" / "tokenizer" / "tokenizer.json"


def _other_inputs(p: PipelineParams, ctx: Context) -> list[str]:
    """The tokenizer (tokenize's output, not the input stage's) and the task files."""
    return [str(model_files(ctx)[1]), *task_files(p.paths.benchmarks_dir)]


def _inputs(p: PipelineParams, ctx: Context) -> list[str]:
    return [*(str(f) for f in sorted(model_files(ctx)[0].glob("*")) if f.is_file()), *_other_inputs(p, ctx)]


def build_results(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    from tasks.evaluate import provenance
    from tasks.evaluate.run import run
    checkpoint, tokenizer = model_files(ctx)
    prov = provenance.collect(Path.cwd(), Path(p.paths.data_dir), p.model_dump(mode="json"), {})
    results = run(checkpoint, tokenizer, p.evaluate, Path(p.paths.benchmarks_dir), tmp, prov)
    rows = results["rows"]
    accuracy: dict = {}
    for r in rows:
        if r["metric"] == "acc":
            setting = {0: "zero-shot", 1: "one-shot"}.get(r["shots"], "few-shot")
            accuracy.setdefault(r["task"], {})[setting] = round(r["value"], 4)
    return {"checkpoint_step": results["provenance"]["checkpoint"]["step"],
            "checkpoint_tokens": results["provenance"]["checkpoint"]["tokens"],
            "examples_scored": sum(r["n"] for r in rows if r["metric"] == "acc"),
            "examples_skipped": sum(r["skipped"] for r in rows if r["metric"] == "acc"),
            "accuracy": accuracy, "fewshot_k": {t: p.evaluate.fewshot_k[t] for t in p.evaluate.tasks
                                                 if "few" in p.evaluate.shots},
            "eval_seconds": results["seconds"]}


def warnings(stats: dict, p: PipelineParams) -> list[str]:
    """Few-shot settings whose prompts were mostly cut to the model's window (tasks.evaluate.evaluator)."""
    import json
    from tasks.evaluate.evaluator import cut_shots_warnings
    from tasks.evaluate.run import RESULTS
    path = Path(p.paths.data_dir) / NAME / "results" / RESULTS
    return cut_shots_warnings(json.loads(path.read_text(encoding="utf-8"))["rows"]) if path.is_file() else []


def check_tokenizer(ctx: Context) -> None:
    """The tokenizer is the one tokenize wrote (its marker's sha256): the train stage refuses an edited one,
    and an evaluation with another would score other tokens under the model's name. The stage and the
    scheduled evaluation of checkpoints both check it. A tokenizer no tokenize run wrote (no marker: put
    there by hand with a model trained elsewhere) is taken as it is, as adopted outputs are."""
    from tasks.core.identity import done_marker
    from tasks.core.registry import stage
    from tasks.core.stage import check_input_passes
    tokenize = stage("tokenize")
    out = tokenize.pass_root(ctx.data_dir, next(ps for ps in tokenize.passes if ps.name == "tokenizer"))
    if done_marker(out).is_file():
        check_input_passes(ctx, tokenize, ("tokenizer",))


def check_inputs(p: PipelineParams, ctx: Context) -> None:
    """The device is there, the tokenizer is tokenize's, every configured task's files load and hold the
    few-shot examples its shot counts draw (each refused before the stage's last results are removed)."""
    from tasks.evalsets.loaders import load_task
    from tasks.evaluate.evaluator import check_shots
    from tasks.evaluate.run import resolve_device
    resolve_device(p.evaluate.device)
    check_tokenizer(ctx)
    for name in p.evaluate.tasks:
        shots = p.evaluate.shot_counts(name)
        check_shots(load_task(name, p.paths.benchmarks_dir, fewshot=any(shots)), shots)


STAGE = Stage(
    # dvc.yaml deps: its package and the code it imports (tests/test_layout.py checks it is all here)
    code=("tasks/evaluate", "tasks/evalsets", "trainer", "kernels", "tasks/tokenize", "tasks/train"),
    name=NAME, section="evaluate", input=lambda p: p.evaluate.input_stage,
    doc="Zero/one/few-shot accuracy of the trained model on the nine MT-NLG tasks (lm-eval prompts), with samples.",
    passes=(GlobalPass("results", build=build_results, params=lambda p: p.evaluate.model_dump(mode="json"),
                       inputs=_inputs),),
    suite="tasks.validation.evaluate",
    cites_lineage=True,
    check=check_inputs,
    warnings=warnings,
    other_inputs=_other_inputs,
)
