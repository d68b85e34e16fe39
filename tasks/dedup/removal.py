"""Passes 5 and 6 of dedup (sharded, one per input shard).

aside:  the removed documents, kept aside with why (exact / fuzzy) and the id and dataset of the
        document each duplicates (`data/dedup/aside/shards/`).
remove: the kept documents, rows copied as Arrow slices (the stage's output shards)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.config import PipelineParams
from tasks.core.passes import Shard, ShardStats
from tasks.core.schema import DOC_SCHEMA, DocWriter, iter_batches, text_bytes
from tasks.core.stage import Context, input_files, shard_per_file
from tasks.dedup.exact import EXACT, FUZZY, doc_column, layout_of
from tasks.dedup.graph import removed_of

ASIDE_SCHEMA = DOC_SCHEMA.append(pa.field("reason", pa.string())) \
    .append(pa.field("duplicate_of", pa.string())).append(pa.field("duplicate_of_dataset", pa.string()))
REASONS = {EXACT: "exact", FUZZY: "fuzzy"}


def plan_aside(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(input_files(ctx))


plan_remove = plan_aside


def _slice(layout: dict, ctx: Context, shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    """This shard's rows of the components pass's dup_of and reason."""
    start, rows = layout["shards"][shard.name]
    return removed_of(ctx, slice(start, start + rows))


def aside_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    layout, ids, dataset = layout_of(ctx), doc_column(ctx, "ids"), doc_column(ctx, "dataset")
    dup_of, reason = _slice(layout, ctx, shard)
    st, row = ShardStats(), 0
    with pq.ParquetWriter(tmp, ASIDE_SCHEMA, compression="zstd", write_statistics=False) as w:
        for batch in iter_batches(Path(shard.inputs[0]), None, p.dedup.batch_docs):
            table = pa.Table.from_batches([batch])
            st.docs_in += table.num_rows
            mine = np.flatnonzero(dup_of[row:row + table.num_rows] >= 0)
            rows, row = row + mine, row + table.num_rows
            if not len(mine):
                continue
            target = dup_of[rows]
            out = table.take(pa.array(mine))
            out = out.append_column("reason", pa.array([REASONS[r] for r in reason[rows]]))
            out = out.append_column("duplicate_of", pa.array([x.decode("utf-8") for x in ids[target]]))
            out = out.append_column("duplicate_of_dataset", pa.array([layout["datasets"][c] for c in dataset[target]]))
            w.write_table(out)
            st.docs_out += len(mine)
            st.bytes_out += text_bytes(out)
    return st


def remove_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    dup_of, reason = _slice(layout_of(ctx), ctx, shard)
    st, row = ShardStats(), 0
    with DocWriter(tmp) as w:
        for batch in iter_batches(Path(shard.inputs[0]), None, p.dedup.batch_docs):
            table = pa.Table.from_batches([batch])
            st.docs_in += table.num_rows
            st.bytes_in += text_bytes(table)
            kept = dup_of[row:row + table.num_rows] < 0
            st.drop("exact_duplicate", int((reason[row:row + table.num_rows] == EXACT).sum()))
            st.drop("fuzzy_duplicate", int((reason[row:row + table.num_rows] == FUZZY).sum()))
            row += table.num_rows
            w.write_table(table.filter(pa.array(kept)))
    if row != len(dup_of):
        raise ValueError(f"dedup: shard {shard.name} has {row} documents, the signatures had {len(dup_of)}")
    st.docs_out, st.bytes_out = w.docs, w.text_bytes
    return st
