"""The `evaluate-checkpoints` flow: evaluates the training run's checkpoints that are not evaluated yet
and appends them to the evaluation history (tasks/evaluate/history.py). prefect.yaml deploys it with a
cron schedule, so new checkpoints are evaluated as training writes them; the UI can also run it.
Its artifact: the history as a table and each task's accuracy against training tokens."""
from __future__ import annotations

if __name__ == "__main__":  # a command: a Ctrl-C or SIGTERM during the imports below ends it with its line
    from flows.command_line import stop_during_imports
    stop_during_imports("interrupted: evaluation stopped; rerun it to go on")

import os
import sys
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.plots import data_uri, history_png
from flows import command_line
from flows.stages import DEFAULT_PARAMS, failed, resolve
from tasks.core import interrupts
from tasks.core.config import PipelineParams, enter_project, load_params
from tasks.core.errors import StageBusy, describe, exit_code_of
from tasks.core.stage import Context
from tasks.evaluate import history as hist
from tasks.evaluate import provenance
from tasks.evaluate.stage import check_tokenizer


def history_markdown(entries: list[dict], new: int, settings: dict | None = None, others: int = 0) -> str:
    """The history as a table and a plot; entries of several training runs (a seed or recipe changed) get a
    run column and a line per run, so one run's step N is not read as another's. `entries` are those of one
    evaluation `settings`; `others` counts the entries kept under other settings, which are not shown."""
    runs = list(dict.fromkeys(e.get("run", "") for e in entries))
    several = len(runs) > 1
    lines = [f"## Evaluation history ({len(entries)} checkpoints, {new} new in this run)", ""]
    if settings:
        lines += [f"Evaluated with: {hist.settings_text(settings)}.", ""]
    if settings and (old := sum(hist.unrecorded(e) for e in entries)):
        lines += [f"{old} of them were evaluated before entries recorded their settings: the same tasks and shots, "
                  "their limit and seed not recorded.", ""]
    if others:
        lines += [f"{others} earlier entries of history.jsonl, evaluated with other settings, are not shown.", ""]
    keys = sorted({k for e in entries for k in e["metrics"] if k.endswith("/acc")})
    head = ["step", *(["run"] if several else []), "tokens", *(k.removesuffix("/acc") for k in keys)]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]  # as many columns in both (none yet: 2)
    for e in sorted(entries, key=lambda e: (e["step"], runs.index(e.get("run", "")))):
        run = f" {e.get('run', '')[:8] or '?'} |" if several else ""
        tokens = f"{e['tokens']:,}" if e.get("tokens") is not None else "?"  # a checkpoint that does not record it
        lines.append(f"| {e['step']} |{run} {tokens} | " + " | ".join(
            f"{e['metrics'][k]:.3f}" if k in e["metrics"] else "" for k in keys) + " |")
    series: dict[str, list[tuple[float, float]]] = {}
    for e in entries:
        for k, v in e["metrics"].items():
            task, shots, metric = k.split("/")
            if metric == "acc" and shots == "0-shot":
                name = f"{task} (run {e.get('run', '')[:8] or '?'})" if several else task
                series.setdefault(name, []).append((e["tokens"] or 0, v))
    if series:
        lines += ["", "### Zero-shot accuracy against training tokens", "",
                  f"![accuracy]({data_uri(history_png('zero-shot accuracy per task', series))})"]
    return "\n".join(lines)


@flow(name="evaluate-checkpoints")
def evaluate_checkpoints(params: PipelineParams = DEFAULT_PARAMS, params_file: str | None = None,
                         checkpoints_dir: str = "", history_dir: str = "") -> dict:
    """Evaluate every checkpoint of the training run not yet evaluated with params `evaluate`'s settings
    (changed tasks, shots, k, limit or seed: every checkpoint still there is evaluated again with them).

    Args:
        params: Every pipeline parameter; `evaluate` says which tasks and shots.
        params_file: A params file to read instead of `params` (leave empty to use `params`).
        checkpoints_dir: The training run's checkpoint folder (step-* folders); empty: the train stage's,
            `<paths.data_dir>/train/work/checkpoints`, then the run before it, kept in `train/work.previous/`
            (another run moved it there, maybe with checkpoints not yet evaluated, or one under evaluation).
        history_dir: Where the per-checkpoint results and history.jsonl go; empty:
            `<paths.data_dir>/evaluate/history`.
    """
    interrupts.guard_flow_run()  # a deployment's run: a stop that a finalizer dropped is raised again
    try:
        return _evaluate_checkpoints(params, params_file, checkpoints_dir, history_dir)
    except Exception as e:  # the run fails with its one line, as a stage's does (the traceback: debug log)
        return failed(e)


def _evaluate_checkpoints(params: PipelineParams, params_file: str | None, checkpoints_dir: str,
                          history_dir: str) -> dict:
    from prefect.runtime import flow_run
    p = resolve(params, params_file)
    if flow_run.id:  # the results cite the flow run that made them
        os.environ["PREFECT__FLOW_RUN_ID"] = str(flow_run.id)
    data = Path(p.paths.data_dir)
    tokenizer = data / "tokenize" / "tokenizer" / "tokenizer.json"
    prov = provenance.collect(Path.cwd(), data, p.model_dump(mode="json"), {})
    prov["train_run"] = provenance.current_run(data)  # work.previous/'s checkpoints: another run's lineage
    # the folders follow paths.data_dir (a fixed data/... looked in the wrong place for another data_dir)
    ckpts = Path(checkpoints_dir) if checkpoints_dir else data / "train" / "work" / "checkpoints"
    # the current run first: a checkpoint moved aside with its run while evaluated is found again after it
    previous = [] if checkpoints_dir else [data / "train" / "work.previous" / "checkpoints"]
    history = Path(history_dir) if history_dir else data / "evaluate" / "history"
    logger = get_run_logger()
    if not ckpts.is_dir():  # no training run yet is not an error for a schedule, but a mistyped folder says so
        logger.warning("no checkpoint folder %s (no training run has saved a checkpoint there yet)", ckpts)
    # tokenize's own check of the tokenizer (evaluate_new runs it once, and not for a pass with nothing new)
    def check() -> None:
        check_tokenizer(Context("evaluate", str(data)))
    # both folders in one pass, under one hold of the history's lock: a command-line pass started between them
    # made this run stop as busy before it published what it had evaluated
    failed = None
    try:
        new = hist.evaluate_new([ckpts] + previous, tokenizer, p.evaluate, Path(p.paths.benchmarks_dir), history, prov,
                                check=check, say=logger.warning)
    except StageBusy:  # another pass holds the history: it publishes it
        raise
    except Exception as e:  # whatever stopped the pass, what it evaluated is published, then this (the UI kept
        new, failed = getattr(e, "new", []), e  # an old table when a checkpoint did not fit its model)
    folders = [ckpts] + [f for f in previous if f.is_dir()]
    every = hist.read_history(history)
    settings = hist.settings_of(p.evaluate, p.paths.benchmarks_dir)
    entries = hist.current(every, settings, p.paths.benchmarks_dir)  # a curve of one set of tasks and docs
    logger.info("evaluated %d new checkpoint(s) of %s; history holds %d with these settings (%d in all)", len(new),
                " and ".join(str(f) for f in folders), len(entries), len(every))
    create_markdown_artifact(key="evaluation-history", markdown=history_markdown(
                                 entries, len(new), settings, len(every) - len(entries)),
                             description="Every evaluated checkpoint of the training run")
    if failed:
        raise failed
    return {"new": [e["checkpoint"] for e in new], "history": len(entries)}


def main(argv: list[str]) -> int:
    try:
        params_file = enter_project(argv[0] if argv else "params.yaml")
        load_params(params_file)  # a bad file fails with its one line before any Prefect server starts
        command_line.prepare()
        state = evaluate_checkpoints(params_file=params_file, return_state=True)
        interrupts.raise_if_requested()  # a Ctrl-C as the flow run ended, which Prefect drops: exit 130, not 0
        if not state.is_completed():
            if interrupts.requested():  # a Ctrl-C that an import turned into an error
                return _interrupted()
            print(state.message, file=sys.stderr)
            return exit_code_of(state.message or "")
        print(state.result())
    except Exception as e:  # noqa: BLE001
        if interrupts.requested():  # a Ctrl-C that an import turned into an error
            return _interrupted()
        code, line = describe(e)
        print(line, file=sys.stderr)
        return code
    except KeyboardInterrupt:  # Ctrl-C: the checkpoints evaluated so far stay in the history
        return _interrupted()
    return 0


def _interrupted() -> int:
    return interrupts.interrupted("interrupted: evaluation stopped; rerun it to go on")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
