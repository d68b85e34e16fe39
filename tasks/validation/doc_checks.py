"""Expectations on any stage that writes the document schema (extract and later text stages)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core.identity import read_json
from tasks.core.schema import COLUMNS, DOC_SCHEMA
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
    (a shard emptied or lost after the stage ended passed the row checks); and shard_facts."""
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0)
            for c in ("documents_unlike_stats", "stats_do_not_add_up")] + shard_facts_expectations()


def stats_do_not_add_up(stats: dict) -> int:
    """|docs_in - docs_out - the drops| of a stage that takes or drops whole documents (extract, filter, dedup;
    not decontaminate, which splits them): stats.json contradicting itself passed."""
    if not all(k in stats for k in ("docs_in", "docs_out", "dropped")):
        return 0
    return abs(int(stats["docs_in"]) - int(stats["docs_out"]) - sum(int(n) for n in stats["dropped"].values()))


def totals(p, shards_dir: Path, whole_documents: bool = True) -> dict:
    """|documents in the output shards - stats.json's docs_out| (the stage's folder holds both); 0 for
    outputs adopted by hand (runner.adopt_outputs), which no stage counted. stats_do_not_add_up (for a stage of
    `whole_documents`), and shard_facts."""
    stats = read_json(Path(shards_dir).parent / "stats.json") or {}
    facts = {**shard_facts(shards_dir), "stats_do_not_add_up": stats_do_not_add_up(stats) if whole_documents else 0}
    if "docs_out" not in stats:
        return {"documents_unlike_stats": 0, **facts}
    rows = sum(pq.read_metadata(f).num_rows for f in sorted(Path(shards_dir).glob("*.parquet"))
               if shard_problem(f) is None)
    return {"documents_unlike_stats": abs(rows - int(stats["docs_out"])), **facts}


def shard_facts_expectations() -> list:
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0)
            for c in ("unreadable_shards", "ids_in_two_shards")]


def shard_problem(f: Path) -> str | None:
    """Why a shard cannot be validated as documents (None if it can): it cannot be read (a zero-byte or cut
    file), or a document column is missing or of another type. Those crashed the suite (exit 1, a bare
    Arrow error) or, in every shard alike, passed."""
    try:
        schema = pq.read_schema(f)
    except (OSError, pa.ArrowException) as e:
        return f"{f.name}: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    wrong = [f"{x.name} missing" if x.name not in schema.names else f"{x.name} is {schema.field(x.name).type}, "
             f"not {x.type}" for x in DOC_SCHEMA if x.name not in schema.names or schema.field(x.name).type != x.type]
    return f"{f.name}: {', '.join(wrong)}" if wrong else None


def shard_facts(shards_dir: Path) -> dict:
    """Shards that cannot be validated (shard_problem), and ids found in two shards: the row checks see one
    batch of 500,000 rows at a time, so an id repeated in another batch passed. With what names them (the
    "_where" columns, in the failure's line)."""
    files = sorted(Path(shards_dir).glob("*.parquet"))
    problems, hashes, owners = [], [], []
    for k, f in enumerate(files):
        if (why := shard_problem(f)) is not None:
            problems.append(why)
            continue
        ids = pq.read_table(f, columns=["id"]).column("id").to_numpy(zero_copy_only=False)
        hashes.append(pd.util.hash_array(ids.astype(object)))
        owners.append(np.full(len(ids), k, np.int32))
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    o = np.concatenate(owners) if owners else np.zeros(0, np.int32)
    order = np.argsort(h, kind="stable")
    h, o = h[order], o[order]
    twice = np.flatnonzero((h[1:] == h[:-1]) & (o[1:] != o[:-1]))
    where = f"e.g. in {files[o[twice[0]]].name} and {files[o[twice[0] + 1]].name}" if len(twice) else ""
    more = f"; {len(problems) - 3} more" if len(problems) > 3 else ""
    return {"unreadable_shards": len(problems), "unreadable_shards_where": "; ".join(problems[:3]) + more,
            "ids_in_two_shards": len(twice), "ids_in_two_shards_where": where}


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
        if shard_problem(f) is not None:  # named by shard_facts, in the totals
            continue
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
