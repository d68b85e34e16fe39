"""Expectations on `filter`: the document schema with unique ids and no empty text; every kept document
of a scored dataset has a quality score in [0, 1]; and, per scored dataset, the classifier kept a
fraction within [min_kept, max_kept] of what the rules passed (a broken classifier that keeps 0% or
100% fails here); kept + aside = the input, per dataset; and no kept document is one the stage's own
decisions dropped (by a rule or the classifier's draw)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.validation import doc_checks

COLUMNS = ("score", "kept_but_dropped")


def expectations() -> list:
    import great_expectations as gx

    E = gx.expectations
    return doc_checks.expectations(COLUMNS) + [
        E.ExpectColumnValuesToBeBetween(column="score", min_value=0, max_value=1),
        E.ExpectColumnValuesToBeBetween(column="kept_but_dropped", min_value=0, max_value=0)]


def totals_expectations() -> list:
    import great_expectations as gx

    E = gx.expectations
    return [E.ExpectColumnValuesToBeBetween(column="kept_fraction_out_of_bounds", min_value=0, max_value=0),
            E.ExpectColumnValuesToBeBetween(column="count_mismatch", min_value=0, max_value=0),
            E.ExpectColumnValuesToBeBetween(column="stats_do_not_add_up", min_value=0, max_value=0),
            *doc_checks.shard_facts_expectations()]


def totals(p, shards_dir: Path) -> dict:
    """Scored datasets whose kept fraction is out of bounds, and documents the output and aside/ hold
    against the stage's own counts: also when the classifier dropped every document."""
    root = Path(p.paths.data_dir) / "filter"
    stats = json.loads((root / "stats.json").read_text(encoding="utf-8"))
    bad, c = sorted(_out_of_bounds(p, stats)), p.filter.classifier
    rows = stats["filter"]["datasets"]
    where = ", ".join(f"{name} kept {rows[name]['kept'] / (rows[name]['kept'] + rows[name]['dropped'].get('classifier', 0)):.3f}"
                      for name in bad) + (f" of those the rules passed, outside [{c.min_kept}, {c.max_kept}]" if bad else "")
    return {"kept_fraction_out_of_bounds": len(bad), "kept_fraction_out_of_bounds_where": where,
            "count_mismatch": count_mismatch(stats, Path(shards_dir), root), **doc_checks.shard_facts(shards_dir),
            "stats_do_not_add_up": doc_checks.stats_do_not_add_up(stats)}


def _decisions(root: Path, shard: str) -> tuple[dict[str, float], dict[str, bool]]:
    """For the output shard named `shard` (one per rules shard, of the same name): the scored documents'
    scores and every document's keep decision by id (the score pass stores both by rules-shard row; keep is
    False for a rule's drop and for the classifier's draw). One shard in memory at a time."""
    ids = pq.read_table(root / "rules" / "shards" / shard, columns=["id"]).column("id").to_pylist()
    with np.load(root / "score" / "shards" / f"{Path(shard).stem}.npz", allow_pickle=False) as z:
        score, keep = z["score"], z["keep"]
    return {i: float(s) for i, s in zip(ids, score) if not np.isnan(s)}, dict(zip(ids, keep.tolist()))


def _out_of_bounds(p, stats: dict) -> set[str]:
    """Scored datasets whose classifier-kept fraction (of the documents the rules passed) is out of bounds."""
    c, bad = p.filter.classifier, set()
    if not c.enabled:
        return bad
    for name, row in stats["filter"]["datasets"].items():
        if name not in c.negatives:
            continue
        scored = row["kept"] + row["dropped"].get("classifier", 0)
        if scored and scored >= c.min_scored_docs and not c.min_kept <= row["kept"] / scored <= c.max_kept:
            bad.add(name)
    return bad


def count_mismatch(stats: dict, shards_dir: Path, root: Path) -> int:
    out, aside = Counter(), Counter()
    for f in sorted(shards_dir.glob("*.parquet")):
        out.update(pq.read_table(f, columns=["dataset"]).column("dataset").to_pylist())
    for f in sorted((root / "aside" / "shards").glob("*.parquet")):
        aside.update(pq.read_table(f, columns=["dataset"]).column("dataset").to_pylist())
    rows = stats["filter"]["datasets"]
    miss = sum(abs(out[n] - r["kept"]) + abs(aside[n] - (r["docs"] - r["kept"])) for n, r in rows.items())
    return miss + sum(v for n, v in (out + aside).items() if n not in rows)


def batches(p, shards_dir: Path):
    root = Path(p.paths.data_dir) / "filter"
    scored = set(p.filter.classifier.negatives) if p.filter.classifier.enabled else set()

    def columns(table: pa.Table, shard: Path) -> dict:
        ids, ds = table.column("id").to_pylist(), table.column("dataset").to_pylist()
        scores, decided = _decisions(root, shard.name)
        # a scored dataset's kept document without a score gets -1: out of [0, 1]
        return {"score": np.array([scores.get(i, -1.0) if d in scored else scores.get(i, np.nan)
                                   for i, d in zip(ids, ds)], dtype=np.float64),
                # an id its rules shard does not hold was not decided there: counted as not kept
                "kept_but_dropped": np.array([not decided.get(i, False) for i in ids], dtype=np.int64)}

    yield from doc_checks.batches(p, shards_dir, columns)
