"""Expectations on any stage that writes the document schema (extract and later text stages)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core.schema import COLUMNS


def expectations(extra_columns: tuple[str, ...] = ()) -> list:
    import great_expectations as gx

    E = gx.expectations
    return [
        E.ExpectTableColumnsToMatchOrderedList(column_list=[*COLUMNS[:1], "text_chars", *COLUMNS[2:], *extra_columns]),
        E.ExpectColumnValuesToNotBeNull(column="id"),
        E.ExpectColumnValuesToBeUnique(column="id"),
        E.ExpectColumnValuesToBeBetween(column="text_chars", min_value=1),
        E.ExpectColumnValuesToNotBeNull(column="dataset"),
        E.ExpectColumnValueLengthsToBeBetween(column="dataset", min_value=1),
        E.ExpectColumnValuesToMatchRegex(column="lang", regex=r"^(?:[a-z]{2,3}|unknown)$"),
        E.ExpectColumnValuesToNotBeNull(column="lang_score"),
    ]


def batches(p, shards_dir: Path, extra_columns: Callable[[pa.Table], dict] | None = None):
    """Each shard as a batch; `text` is replaced by its length so a shard's frame stays small.
    `extra_columns(table)` may add derived columns (computed from the text) for a stage's suite."""
    for f in sorted(shards_dir.glob("*.parquet")):
        t = pq.read_table(f)
        extra = extra_columns(t) if extra_columns else {}
        t = t.set_column(t.schema.get_field_index("text"), "text_chars", pc.utf8_length(t["text"]))
        for name, values in extra.items():
            t = t.append_column(name, pa.array(values))
        yield f.name, t.to_pandas()
