"""One task at one shot count: render, score, and the metrics lm-evaluation-harness reports for it
(LAMBADA: acc = every token of the last word greedy, perplexity = exp(-mean log-likelihood); the
multiple-choice tasks: acc = the most likely choice is gold, acc_norm (PiQA, HellaSwag) = the same
after dividing each log-likelihood by the choice's length in characters). Standard errors: the
sample standard deviation / sqrt(n) for means, as lm-eval; for perplexity the delta method
(perplexity x the stderr of the mean log-likelihood), where lm-eval bootstraps.

A doc with a continuation longer than the model's window cannot be scored (lm-eval stops the whole run
on one): it is left out and counted in the row's `skipped`, so `n` is the docs actually scored."""
from __future__ import annotations

import math
import random
import statistics

from tasks.core.errors import ConfigError
from tasks.evalsets.loaders import TaskData
from tasks.evalsets.prompts import DRAWS_ONE_MORE, fewshot_prefixes, render
from tasks.evaluate.scoring import Scorer

METRICS = {"lambada": ("acc", "perplexity"), "piqa": ("acc", "acc_norm"), "hellaswag": ("acc", "acc_norm")}
DEFAULT_METRICS = ("acc",)


def metrics_of(task: str) -> tuple[str, ...]:
    return METRICS.get(task, DEFAULT_METRICS)


def select(n: int, limit: int | None, seed: int) -> list[int]:
    """All docs, or `limit` of them drawn with the seed (kept in file order)."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def _stderr(values: list[float]) -> float:
    # a diverged checkpoint's NaN log-likelihoods: Python 3.11's stdev raised AttributeError on them
    if len(values) < 2 or not all(map(math.isfinite, values)):
        return float("nan")
    return statistics.stdev(values) / math.sqrt(len(values))


def _perplexity(logliks: list[float]) -> float:
    """exp of the mean negative log-likelihood; inf past the floats (huge logits: math.exp overflowed), NaN for
    NaN weights. Either is recorded as it is, and the suite flags it (perplexity_invalid)."""
    try:
        return math.exp(-statistics.fmean(logliks))
    except OverflowError:
        return float("inf")


def check_shots(task: TaskData, shot_counts: list[int]) -> None:
    """Each k-shot evaluation of the task can draw its shots (the refusal evaluate_task would meet)."""
    docs, pool = render(task)
    for k in shot_counts:
        try:
            fewshot_prefixes([], docs, pool, k, 0, task.name in DRAWS_ONE_MORE)
        except ConfigError as e:
            raise ConfigError(f"task {task.name}: {e}") from None


def evaluate_task(scorer: Scorer, task: TaskData, shots: int, seed: int = 1234,
                  limit: int | None = None) -> list[dict]:
    """Rows of (task, shots, metric, value, stderr, n)."""
    docs, pool = render(task)
    indices = select(len(docs), limit, seed)
    try:
        prefixes = fewshot_prefixes(indices, docs, pool, shots, seed, task.name in DRAWS_ONE_MORE)
    except ConfigError as e:
        raise ConfigError(f"task {task.name}: {e}") from None
    requests = [docs[i].pairs(p) for i, p in zip(indices, prefixes)]
    scored, cut_docs = scorer.score_and_cut(requests, desc=f"{task.name} {shots}-shot")
    per_doc: dict[str, list[float]] = {m: [] for m in ("acc", "acc_norm", "loglik")}
    skipped = cut = 0
    for i, lls, was_cut in zip(indices, scored, cut_docs):
        doc = docs[i]
        if any(x is None for x in lls):
            skipped += 1
            continue
        cut += was_cut  # the prompt cut from the left to the window (lm-eval's truncation): shots go first
        if task.name == "lambada":
            (ll, greedy), = lls
            per_doc["acc"].append(float(greedy))
            per_doc["loglik"].append(ll)
            continue
        values = [ll for ll, _ in lls]
        best = max(range(len(values)), key=lambda j: (values[j], -j))  # first of equal maxima, as argmax
        norm = [v / len(c) for v, c in zip(values, doc.choices)]
        best_norm = max(range(len(norm)), key=lambda j: (norm[j], -j))
        per_doc["acc"].append(float(best == doc.gold))
        per_doc["acc_norm"].append(float(best_norm == doc.gold))
    rows = []
    n = len(indices) - skipped
    if n == 0:
        raise ConfigError(f"task {task.name}: no doc fits the model's {scorer.window}-token window")
    for metric in metrics_of(task.name):
        if metric == "perplexity":
            ll = per_doc["loglik"]
            value = _perplexity(ll)
            rows.append(_row(task.name, shots, metric, value, value * _stderr(ll), n, skipped, cut))
        else:
            rows.append(_row(task.name, shots, metric, statistics.fmean(per_doc[metric]), _stderr(per_doc[metric]),
                             n, skipped, cut))
    return rows


def _row(task: str, shots: int, metric: str, value: float, stderr: float, n: int, skipped: int, cut: int) -> dict:
    return {"task": task, "shots": shots, "metric": metric, "value": value,
            "stderr": None if math.isnan(stderr) else stderr, "n": n, "skipped": skipped, "cut": cut}


def cut_shots_warnings(rows: list[dict], window: int | None = None) -> list[str]:
    """One line naming the few-shot settings for which most prompts were cut to the model's window: their
    shots were dropped from the left, so those scores are not the k-shot ones they are labelled (lm-eval
    cuts them the same way, silently)."""
    cut, seen = [], set()
    for r in rows:  # once per task and shot setting (its metrics share the prompts)
        if r["shots"] and r.get("cut", 0) * 2 > r["n"] and (r["task"], r["shots"]) not in seen:
            seen.add((r["task"], r["shots"]))
            cut.append(f"{r['task']} {r['shots']}-shot ({r['cut']} of {r['n']})")
    if not cut:
        return []
    where = f"the model's {window}-token window" if window else "the model's window"
    return [f"few-shot prompts cut to {where}, their shots lost, so these scores are not k-shot ones: "
            + ", ".join(cut)]
