"""Expectations on `evaluate`, one row per (task, shots, metric): every configured task and shot
setting has its metrics; accuracies lie in [0, 1]; perplexity is finite and >= 1; at least one doc was
scored; and the results carry their provenance (checkpoint step, params hash)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from tasks.validation.runner import Batch


def expectations() -> list:
    import great_expectations as gx
    return [gx.expectations.ExpectColumnValuesToBeBetween(column="accuracy_out_of_range", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="perplexity_invalid", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="n", min_value=1),
            gx.expectations.ExpectColumnValuesToBeBetween(column="missing", min_value=0, max_value=0),
            gx.expectations.ExpectColumnValuesToBeBetween(column="provenance_missing", min_value=0, max_value=0)]


def batches(p, results_dir: Path):
    from tasks.evaluate.evaluator import metrics_of
    from tasks.evaluate.run import RESULTS
    results = json.loads((Path(results_dir) / RESULTS).read_text(encoding="utf-8"))
    prov = results.get("provenance", {})
    no_prov = int(prov.get("checkpoint", {}).get("step") is None or not prov.get("params_sha256"))
    got = {(r["task"], r["shots"], r["metric"]): r for r in results["rows"]}
    rows = []
    for task in p.evaluate.tasks:
        for shots in p.evaluate.shot_counts(task):
            for metric in metrics_of(task):
                r = got.get((task, shots, metric))
                v = r["value"] if r else float("nan")
                rows.append({"row": f"{task} {shots}-shot {metric}", "n": r["n"] if r else 0, "missing": int(r is None),
                             "accuracy_out_of_range": int(metric != "perplexity" and not 0 <= v <= 1),
                             "perplexity_invalid": int(metric == "perplexity" and not (math.isfinite(v) and v >= 1)),
                             "provenance_missing": no_prov})
    frame = pd.DataFrame(rows)
    yield Batch(frame, [("results", 0, len(frame))])
