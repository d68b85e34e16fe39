"""Expectations on `decontaminate`: the document schema, and a re-scan of every output document
that finds no task n-gram left (other than those ignored as too frequent)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks import decontaminate
from tasks.validation import documents


def expectations() -> list:
    import great_expectations as gx

    return documents.expectations(("task_ngram_hits",)) + [
        gx.expectations.ExpectColumnValuesToBeBetween(column="task_ngram_hits", min_value=0, max_value=0),
    ]


def batches(p, shards_dir: Path):
    rt = decontaminate.runtime_from_disk(p)
    index, frequent = decontaminate.index_for(rt), decontaminate.frequent_entries(rt)

    def hits(table: pa.Table) -> dict:
        doc, _, _, entry = decontaminate.batch_hits(index, table.column("text").to_pylist())
        keep = ~np.isin(entry, frequent)
        return {"task_ngram_hits": np.bincount(doc[keep], minlength=table.num_rows).astype(np.int64)}

    yield from documents.batches(p, shards_dir, hits)
