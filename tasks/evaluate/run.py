"""One evaluation: a model (checkpoint or Hugging Face folder) on the configured tasks and shot
settings, plus the generation samples, written as results.json (rows + provenance), metrics.json (DVC
metrics) and report.md (MT-NLG Figure 3's table). Used by the `evaluate` stage and by the scheduled
evaluation of new checkpoints alike."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tasks.core.errors import ConfigError
from tasks.core.passes import atomic_write_text
from tasks.evalsets.loaders import load_task
from tasks.evaluate.config import EvaluateParams
from tasks.evaluate.evaluator import evaluate_task
from tasks.evaluate.generate import generate
from tasks.evaluate.model_io import LoadedModel, load
from tasks.evaluate.scoring import Scorer

RESULTS, METRICS, REPORT = "results.json", "metrics.json", "report.md"
# Figure 3 reports accuracy for every task. PiQA's and HellaSwag's cells add lm-eval's acc_norm: GPT-3, whose
# evaluation MT-NLG follows, scored such choices by length-normalised likelihood, and MT-NLG's HellaSwag
# figures (0.80-0.82) are at the level of normalised accuracy (175B-class models' plain acc is ~0.6)
SECOND = {"piqa": "acc_norm", "hellaswag": "acc_norm"}


def resolve_device(choice: str) -> str:
    import torch
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("evaluate.device: cuda, and torch finds no CUDA device here: use auto (a GPU where "
                          "there is one) or cpu")
    return ("cuda" if torch.cuda.is_available() else "cpu") if choice == "auto" else choice


def evaluate_model(lm: LoadedModel, cfg: EvaluateParams, benchmarks_dir: Path) -> tuple[list[dict], list[dict]]:
    """(metric rows, generations)."""
    scorer = Scorer(lm, token_budget=cfg.token_budget, device=resolve_device(cfg.device), progress=sys.stderr.isatty())
    rows = []
    for name in cfg.tasks:
        shots = cfg.shot_counts(name)
        task = load_task(name, benchmarks_dir, fewshot=any(shots))
        for k in shots:
            rows += evaluate_task(scorer, task, k, seed=cfg.seed, limit=cfg.limit)
    g = cfg.generation
    gens = [{"prompt": prompt,
             "greedy": generate(lm, prompt, g.max_new_tokens),
             "sampled": generate(lm, prompt, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.seed)}
            for prompt in g.prompts]
    return rows, gens


def dvc_metrics(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(r["task"], {}).setdefault(f"{r['shots']}-shot", {})[r["metric"]] = r["value"]
    return out


def figure3_table(rows: list[dict]) -> str:
    """Accuracy per task (rows) and shot setting (columns: zero, one, few with its k), as MT-NLG's Figure 3."""
    cell = {(r["task"], r["shots"]): r for r in rows if r["metric"] == "acc"}
    second = {(r["task"], r["shots"]): r["value"] for r in rows if r["metric"] == SECOND.get(r["task"])}
    columns = {0: "zero-shot", 1: "one-shot"}
    settings = sorted({min(s, 2) for _, s in cell})
    lines = ["| task | " + " | ".join(columns.get(s, "few-shot") for s in settings) + " |",
             "|---" * (len(settings) + 1) + "|"]
    for task in dict.fromkeys(t for t, _ in cell):
        cells = []
        for setting in settings:
            r = next((r for (t, s), r in cell.items() if t == task and min(s, 2) == setting), None)
            err = f" ± {r['stderr']:.3f}" if r and r.get("stderr") is not None else ""
            k = f" (k={r['shots']})" if r and r["shots"] > 1 else ""
            norm = f", {SECOND[task]} {second[task, r['shots']]:.3f}" if r and (task, r["shots"]) in second else ""
            cells.append(f"{r['value']:.3f}{err}{norm}{k}" if r else "")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(out: Path, rows: list[dict], gens: list[dict], provenance: dict, seconds: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    results = {"rows": rows, "generations": gens, "provenance": provenance, "seconds": round(seconds, 3)}
    atomic_write_text(out / RESULTS, json.dumps(results, indent=1) + "\n")
    atomic_write_text(out / METRICS, json.dumps(dvc_metrics(rows), indent=1, sort_keys=True) + "\n")
    ck = provenance.get("checkpoint", {})
    md = [f"# Evaluation of {ck.get('path')} " + (f"(step {ck['step']}, {ck.get('tokens')} tokens)"
                                                   if ck.get("step") is not None else f"({ck.get('source')})"), "",
          figure3_table(rows), "", "## Generations", ""]
    for g in gens:
        md += [f"**Prompt:** `{g['prompt']!r}`", "", f"- greedy: `{g['greedy']!r}`", f"- sampled: `{g['sampled']!r}`", ""]
    atomic_write_text(out / REPORT, "\n".join(md) + "\n")
    return results


def run(model: Path, tokenizer: Path | None, cfg: EvaluateParams, benchmarks_dir: Path, out: Path,
        provenance: dict) -> dict:
    start = time.perf_counter()
    lm = load(model, tokenizer)
    rows, gens = evaluate_model(lm, cfg, benchmarks_dir)
    from tasks.evaluate.provenance import cited_for
    provenance = {**cited_for(provenance, lm.run, Path(model)),
                  "checkpoint": {"path": str(model), "step": lm.step, "tokens": lm.tokens, "source": lm.source}}
    return write_results(out, rows, gens, provenance, time.perf_counter() - start)


def main(argv: list[str]) -> int:
    """python -m tasks.evaluate.run MODEL [--tokenizer tokenizer.json] [--out DIR] [--params params.yaml]:
    evaluate any checkpoint or Hugging Face GPT-2 folder with params.yaml's `evaluate` settings."""
    import argparse

    from tasks.core.config import load_params
    from tasks.core.errors import describe
    from tasks.evaluate import provenance
    ap = argparse.ArgumentParser(description="Evaluate a checkpoint or a Hugging Face GPT-2 folder on the MT-NLG tasks")
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokenizer", type=Path, default=None, help="a checkpoint's tokenizer.json")
    ap.add_argument("--out", type=Path, default=Path("data/evaluate/adhoc"))
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    try:
        p = load_params(args.params)
        prov = provenance.collect(Path.cwd(), Path(p.paths.data_dir), p.model_dump(mode="json"), {})
        prov["train_run"] = provenance.current_run(Path(p.paths.data_dir))  # any model: its lineage is checked
        results = run(args.model, args.tokenizer, p.evaluate, Path(p.paths.benchmarks_dir), args.out, prov)
    except Exception as e:  # noqa: BLE001
        code, line = describe(e)
        print(line, file=sys.stderr)
        return code
    print(figure3_table(results["rows"]))
    print(f"results: {args.out / RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
