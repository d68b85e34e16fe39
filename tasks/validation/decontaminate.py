"""Expectations on `decontaminate`: the document schema, as many documents as stats.json says, and a
re-scan of every output document that finds no task n-gram left (other than those ignored as too frequent)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.decontaminate.matching import batch_hits
from tasks.decontaminate.stage import finished_index
from tasks.validation import doc_checks
from tasks.validation.doc_checks import totals_expectations  # noqa: F401 - this suite's totals


def totals(p, shards_dir: Path) -> dict:
    return doc_checks.totals(p, shards_dir, whole_documents=False)  # it splits documents: out may exceed in


def expectations() -> list:
    import great_expectations as gx

    return doc_checks.expectations(("task_ngram_hits",)) + [
        gx.expectations.ExpectColumnValuesToBeBetween(column="task_ngram_hits", min_value=0, max_value=0),
    ]


def batches(p, shards_dir: Path):
    index, frequent = finished_index(p.paths.data_dir)

    def hits(table: pa.Table, _shard: Path) -> dict:
        # batch_docs documents at a time, as the stage scans them: a whole shard at once (a curated corpus is
        # one shard) took ~12x its text in memory (300 MB of text: 3.6 GB), after the stage itself had passed
        out, step = np.zeros(table.num_rows, np.int64), p.decontaminate.batch_docs
        for a in range(0, table.num_rows, step):
            texts = table.column("text").slice(a, step).to_pylist()
            doc, _, _, entry = batch_hits(index, texts)
            keep = ~np.isin(entry, frequent)
            out[a:a + len(texts)] = np.bincount(doc[keep], minlength=len(texts))
        return {"task_ngram_hits": out}

    yield from doc_checks.batches(p, shards_dir, hits)
