"""Expectations on any stage that writes the document schema (extract and later text stages)."""
from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.schema import COLUMNS


def expectations() -> list:
    import great_expectations as gx

    E = gx.expectations
    return [
        E.ExpectTableColumnsToMatchOrderedList(column_list=[*COLUMNS[:1], "text_chars", *COLUMNS[2:]]),
        E.ExpectColumnValuesToNotBeNull(column="id"),
        E.ExpectColumnValuesToBeUnique(column="id"),
        E.ExpectColumnValuesToBeBetween(column="text_chars", min_value=1),
        E.ExpectColumnValuesToNotBeNull(column="dataset"),
        E.ExpectColumnValueLengthsToBeBetween(column="dataset", min_value=1),
        E.ExpectColumnValuesToMatchRegex(column="lang", regex=r"^(?:[a-z]{2,3}|unknown)$"),
        E.ExpectColumnValuesToNotBeNull(column="lang_score"),
    ]


def batches(shards_dir: Path):
    """Each shard as a batch; `text` is replaced by its length so a shard's frame stays small."""
    for f in sorted(shards_dir.glob("*.parquet")):
        t = pq.read_table(f)
        t = t.set_column(t.schema.get_field_index("text"), "text_chars", pc.utf8_length(t["text"]))
        yield f.name, t.to_pandas()
