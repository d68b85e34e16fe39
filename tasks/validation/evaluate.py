"""Expectations on `evaluate`, one row per (task, shots, metric): every configured task and shot
setting has its metrics; accuracies lie in [0, 1]; perplexity is finite and >= 1; at least one doc was
scored, and the docs scored and skipped are the task's (all, or `limit`); metrics.json (what `dvc metrics`
shows) is the results' values; and the results carry their provenance (checkpoint step, params hash)."""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from tasks.validation.runner import Batch


def expectations() -> list:
    import great_expectations as gx
    return [gx.expectations.ExpectColumnValuesToBeBetween(column="accuracy_out_of_range", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="perplexity_invalid", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="n", min_value=1),
            gx.expectations.ExpectColumnValuesToBeBetween(column="missing", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="docs_not_the_tasks", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="stderr_invalid", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="rows_for_it", min_value=0, max_value=1)]


def totals_expectations() -> list:
    import great_expectations as gx
    return [gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0)
            for c in ("metrics_json_differs", "provenance_missing")]


def totals(p, results_dir: Path) -> dict:
    """Facts about the results as a whole (on every row they were '36 unexpected' for one wrong value)."""
    from tasks.evaluate.run import METRICS, RESULTS, dvc_metrics
    results = json.loads((Path(results_dir) / RESULTS).read_text(encoding="utf-8"))
    try:
        differs = int(json.loads((Path(results_dir) / METRICS).read_text(encoding="utf-8"))
                      != json.loads(json.dumps(dvc_metrics(results["rows"]))))
    except (OSError, ValueError):
        differs = 1
    prov = results.get("provenance", {})
    return {"metrics_json_differs": differs,
            "provenance_missing": int(prov.get("checkpoint", {}).get("step") is None or not prov.get("params_sha256"))}


def batches(p, results_dir: Path):
    from tasks.evalsets.loaders import load_task
    from tasks.evalsets.prompts import render
    from tasks.evaluate.evaluator import metrics_of, select
    from tasks.evaluate.run import RESULTS
    results = json.loads((Path(results_dir) / RESULTS).read_text(encoding="utf-8"))
    got = {(r["task"], r["shots"], r["metric"]): r for r in results["rows"]}
    count = Counter((r["task"], r["shots"], r["metric"]) for r in results["rows"])  # a second, other row passed
    rows = []
    for task in p.evaluate.tasks:
        docs, _ = render(load_task(task, Path(p.paths.benchmarks_dir), fewshot=False), fewshot_pool=False)
        expected = len(select(len(docs), p.evaluate.limit, p.evaluate.seed))
        for shots in p.evaluate.shot_counts(task):
            for metric in metrics_of(task):
                r = got.get((task, shots, metric))
                v = r["value"] if r else float("nan")
                rows.append({"row": f"{task} {shots}-shot {metric}", "n": r["n"] if r else 0, "missing": int(r is None),
                             "docs_not_the_tasks": int(r is not None and r["n"] + r.get("skipped", 0) != expected),
                             "accuracy_out_of_range": int(metric != "perplexity" and not 0 <= v <= 1),
                             "perplexity_invalid": int(metric == "perplexity" and not (math.isfinite(v) and v >= 1)),
                             # None where one doc gives none; NaN or negative passed
                             "stderr_invalid": int(r is not None and r.get("stderr") is not None
                                                   and not (math.isfinite(r["stderr"]) and r["stderr"] >= 0)),
                             "rows_for_it": count[(task, shots, metric)]})
    frame = pd.DataFrame(rows)
    # a "shard" per result row: a failure names its task, shots and metric (it said "in shard results")
    yield Batch(frame, [(row["row"], i, i + 1) for i, row in enumerate(rows)] or [("results", 0, 0)])
