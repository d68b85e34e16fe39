"""Our evaluator against lm-evaluation-harness on the same model and the same docs, 0-shot, all nine tasks.

    python -m benchmarks.eval [--model DIR] [--limit 200 | --full] [--batch-size 32]

The model is a Hugging Face GPT-2-format folder. By default the benchmark makes one: a GPT with MT-NLG's
2048-token window (4 layers, d_model 256), seeded initial weights, and the pipeline's tokenizer
(data/tokenize/tokenizer/tokenizer.json, made by `make run`), exported as the train stage exports.
(The sample run's own model has a 128-token window: too short for RACE's articles, and lm-eval refuses
a continuation longer than the window.) Untrained weights are enough here: the figure is whether two
harnesses agree on the same weights, not how good the weights are. Each task's docs are subsampled with a fixed seed (--limit per task; --full: every doc). Ours reads
the official release files; lm-eval (the `bench` extra, when installed) reads the same docs rewritten
into its hub schema by benchmarks/lmeval_local.py, with its own prompt templates, through its `hf`
backend on the same folder, in the same process, fp32 on CPU. Prints both accuracies per task, the
largest difference and the speed ratio (wall time of each harness's whole evaluation), ending with
`eval_tasks=<count> eval_max_acc_diff=<d> eval_speedup_vs_lmeval=<x> eval_examples_per_s=<n>`.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from tasks.evalsets.loaders import TASK_NAMES, load_task
from tasks.evaluate.evaluator import evaluate_task, select
from tasks.evaluate.model_io import load
from tasks.evalsets.prompts import render
from tasks.evaluate.scoring import Scorer

SEED = 1234
TOKENIZER = Path("data/tokenize/tokenizer/tokenizer.json")


def make_model(out: Path, tokenizer: Path) -> Path:
    import json
    import shutil

    from safetensors.torch import save_file

    from tasks.tokenize import tokenizer as tokenizers
    from trainer.config import ModelParams, padded_vocab
    from trainer.export import gpt2_state, hf_config
    from trainer.model import GPT
    tok = tokenizers.load(tokenizer)
    p = ModelParams(n_layer=4, n_head=4, d_model=256, seq_len=2048, vocab_size=padded_vocab(tok.get_vocab_size(), 1),
                    fused_kernels=False)
    state = dict(GPT(p, seed=SEED).named_parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_file(gpt2_state(lambda n: state[n].detach(), p), str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(tokenizer, out / "tokenizer.json")
    (out / "config.json").write_text(json.dumps(hf_config(p, tokenizers.eod_id(tok)), indent=1), encoding="utf-8")
    return out


def ours(model: Path, tasks, limit: int | None, token_budget: int) -> tuple[dict, float, int]:
    start = time.perf_counter()
    scorer = Scorer(load(model), token_budget=token_budget, progress=False)
    results, docs = {}, 0
    for task in tasks:
        for row in evaluate_task(scorer, task, 0, seed=SEED, limit=limit):
            results[(task.name, row["metric"])] = row["value"]
            docs = docs + row["n"] if row["metric"] == "acc" else docs
    return results, time.perf_counter() - start, docs


def lmeval(model: Path, tasks, limit: int | None, batch_size: int) -> tuple[dict, float]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from benchmarks.lmeval_local import write_tasks
    with tempfile.TemporaryDirectory() as tmp:
        picks = [(t, select(len(render(t)[0]), limit, SEED)) for t in tasks]
        names = write_tasks(picks, Path(tmp))
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32",
                                      tasks=names, num_fewshot=0, batch_size=batch_size, device="cpu",
                                      task_manager=TaskManager(include_path=tmp), random_seed=SEED,
                                      log_samples=False)
        elapsed = time.perf_counter() - start
    results = {}
    for name, res in out["results"].items():
        for key, value in res.items():
            if key.endswith(",none") and "stderr" not in key:
                results[(name.removeprefix("local_"), key.split(",")[0])] = value
    return results, elapsed


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a Hugging Face GPT-2 folder (default: made here)")
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="for the model made here")
    ap.add_argument("--benchmarks", type=Path, default=Path("../shared/benchmarks"))
    ap.add_argument("--limit", type=int, default=200, help="docs per task (fixed seed)")
    ap.add_argument("--full", action="store_true", help="every doc of every task")
    ap.add_argument("--batch-size", type=int, default=32, help="lm-eval's batch size")
    ap.add_argument("--token-budget", type=int, default=16384, help="our tokens per batch")
    args = ap.parse_args(argv)
    if args.model is None:
        if not args.tokenizer.is_file():
            print(f"no tokenizer at {args.tokenizer}: run `make run` first, or pass --model", file=sys.stderr)
            return 2
        args.model = make_model(Path(tempfile.mkdtemp(prefix="bench-eval-")) / "hf", args.tokenizer)
    elif not (args.model / "config.json").is_file():
        print(f"no Hugging Face model at {args.model}", file=sys.stderr)
        return 2
    limit = None if args.full else args.limit
    tasks = [load_task(n, args.benchmarks) for n in TASK_NAMES]
    our, our_s, docs = ours(args.model, tasks, limit, args.token_budget)
    try:
        import lm_eval  # noqa: F401
        have = True
    except ImportError:
        have = False
        print("lm-eval not installed (pip install -e '.[bench]'): our side only", file=sys.stderr)
    their, their_s = lmeval(args.model, tasks, limit, args.batch_size) if have else ({}, float("nan"))
    logging.disable(logging.NOTSET)
    print(f"{'task':<12}{'metric':<12}{'ours':>12}{'lm-eval':>12}{'diff':>10}")
    worst = 0.0
    for (task, metric), value in our.items():
        other = their.get((task, metric))
        diff = abs(value - other) if other is not None else float("nan")
        if metric != "perplexity" and other is not None:
            worst = max(worst, diff)
        shown = "" if other is None else f"{other:>12.6g}{diff:>10.2e}"
        print(f"{task:<12}{metric:<12}{value:>12.6g}{shown}")
    print(f"ours: {our_s:.1f} s, lm-eval: {their_s:.1f} s, {docs} examples")
    print(f"eval_tasks={len(tasks)} eval_max_acc_diff={worst if have else float('nan'):.4g} "
          f"eval_speedup_vs_lmeval={their_s / our_s:.3g} eval_examples_per_s={docs / our_s:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
