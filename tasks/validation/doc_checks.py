"""Expectations on any stage that writes the document schema (extract and later text stages)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core.identity import read_json
from tasks.core.schema import COLUMNS
from tasks.extract.langid import LABELS
from tasks.validation.runner import Batch

MAX_BATCH_ROWS = 500_000  # bounds a batch's memory (no text in it: ~100 bytes a row)


def expectations(extra_columns: tuple[str, ...] = (), require_rows: bool = False) -> list:
    """`require_rows`: a stage that writes no document at all has failed (extract); a filtering
    stage may legitimately remove everything from a small input."""
    import great_expectations as gx

    E = gx.expectations
    return [E.ExpectTableRowCountToBeBetween(min_value=1)] * require_rows + [
        E.ExpectTableColumnsToMatchOrderedList(column_list=[*COLUMNS[:1], "text_chars", *COLUMNS[2:], *extra_columns]),
        E.ExpectColumnValuesToNotBeNull(column="id"),
        E.ExpectColumnValuesToBeUnique(column="id"),
        # GX's range and set expectations pass nulls: a null text or language is refused on its own
        E.ExpectColumnValuesToNotBeNull(column="text_chars"),
        E.ExpectColumnValuesToBeBetween(column="text_chars", min_value=1),
        E.ExpectColumnValuesToNotBeNull(column="dataset"),
        E.ExpectColumnValueLengthsToBeBetween(column="dataset", min_value=1),
        # lid.176's labels (tasks/extract/langid.py), so 'English', 'EN' or 'eng' cannot pass as a language
        E.ExpectColumnValuesToNotBeNull(column="lang"),
        E.ExpectColumnValuesToBeInSet(column="lang", value_set=sorted(LABELS | {"unknown"})),
        E.ExpectColumnValuesToNotBeNull(column="lang_score"),
        E.ExpectColumnValuesToBeBetween(column="lang_score", min_value=0, max_value=1),
    ]


def totals_expectations() -> list:
    """The output holds as many documents as its stage says it wrote: checked once, also when it holds none
    (a shard emptied or lost after the stage ended passed the row checks)."""
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToBeBetween(column="documents_unlike_stats", min_value=0, max_value=0)]


def totals(p, shards_dir: Path) -> dict:
    """|documents in the output shards - stats.json's docs_out| (the stage's folder holds both); 0 for
    outputs adopted by hand (runner.adopt_outputs), which no stage counted."""
    stats = read_json(Path(shards_dir).parent / "stats.json") or {}
    if "docs_out" not in stats:
        return {"documents_unlike_stats": 0}
    rows = sum(pq.read_metadata(f).num_rows for f in sorted(Path(shards_dir).glob("*.parquet")))
    return {"documents_unlike_stats": abs(rows - int(stats["docs_out"]))}


def _shard_table(f: Path, extra_columns: Callable[[pa.Table, Path], dict] | None) -> pa.Table:
    """One read per shard: `text` becomes its length, plus any columns derived from the text."""
    t = pq.read_table(f)
    extra = extra_columns(t, f) if extra_columns else {}
    t = t.set_column(t.schema.get_field_index("text"), "text_chars", pc.utf8_length(t["text"]))
    for name, values in extra.items():
        t = t.append_column(name, pa.array(values))
    return t


def batches(p, shards_dir: Path, extra_columns: Callable[[pa.Table, Path], dict] | None = None) -> Iterator[Batch]:
    """The shards, grouped into batches of up to MAX_BATCH_ROWS rows. `extra_columns(table, shard path)` may
    add derived columns (from the text, or from what the stage recorded for that shard) for a stage's suite."""
    tables, shards, rows = [], [], 0
    for f in sorted(shards_dir.glob("*.parquet")):
        t = _shard_table(f, extra_columns)
        if rows and t.num_rows and rows + t.num_rows > MAX_BATCH_ROWS:  # a batch is empty only if all are
            yield Batch(pa.concat_tables(tables).to_pandas(), shards)
            tables, shards, rows = [], [], 0
        tables.append(t)
        shards.append((f.name, rows, rows + t.num_rows))
        rows += t.num_rows
    if tables:
        yield Batch(pa.concat_tables(tables).to_pandas(), shards)
    else:  # no shard at all: one empty batch, so the row-count expectation fails
        columns = [COLUMNS[0], "text_chars", *COLUMNS[2:]]
        yield Batch(pd.DataFrame({c: [] for c in columns}), [("(no shards)", 0, 0)])
