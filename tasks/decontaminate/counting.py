"""Passes 2 and 3 of decontamination: per shard, how many documents contain each task n-gram
(sharded); then, over the whole corpus, which n-grams are too common to mean contamination
(global: `frequent.npy`, plus the per-task report)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.core.config import PipelineParams
from tasks.core.passes import Shard, ShardStats, savez
from tasks.core.schema import iter_batches, text_bytes
from tasks.core.stage import Context, input_files, shard_per_file
from tasks.decontaminate.matching import batch_hits, load_index


def index_of(ctx: Context):
    return load_index(ctx.pass_dir("index"), ctx.digests["index"])


def plan_count(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(input_files(ctx), ".npz")


def count_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    """How many documents of this shard contain each task n-gram (sparse), and which rows have any
    match (the removal pass re-examines only those)."""
    index, st = index_of(ctx), ShardStats()
    pairs, rows, row0 = [], [], 0
    for batch in iter_batches(Path(shard.inputs[0]), ["text"], p.decontaminate.batch_docs):
        texts = batch.column("text").to_pylist()
        st.docs_in += len(texts)
        st.bytes_in += text_bytes(batch)
        doc, _, _, entry = batch_hits(index, texts)
        pairs.append(np.unique((doc + row0) * len(index.hashes) + entry))  # one count per document
        rows.append(np.unique(doc) + row0)
        row0 += len(texts)
    pairs_all = np.concatenate(pairs) if pairs else np.empty(0, np.int64)
    entries, docs = np.unique(pairs_all % max(1, len(index.hashes)), return_counts=True)
    matched_rows = np.concatenate(rows) if rows else np.empty(0, np.int64)
    with open(tmp, "wb") as fh:
        savez(fh, entries=entries, docs=docs.astype(np.int64), rows=matched_rows)
    st.docs_out = st.docs_in
    st.extra = {"docs_with_matches": int(len(matched_rows))}
    return st


def count_file(ctx: Context, shard_name: str) -> Path:
    return ctx.pass_dir("count") / "shards" / f"{shard_name}.npz"


def build_frequent(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    index = index_of(ctx)
    docs = np.zeros(len(index.hashes), dtype=np.int64)
    for f in sorted((ctx.pass_dir("count") / "shards").glob("*.npz")):
        with np.load(f) as z:
            np.add.at(docs, z["entries"], z["docs"])
    frequent = np.nonzero(docs > p.decontaminate.max_doc_frequency)[0]
    with open(tmp / "frequent.npy", "wb") as fh:
        np.save(fh, frequent)
    per_task = {name: {**stats, "frequent_ngrams_ignored": int(np.count_nonzero(index.masks[frequent] & (1 << t)))}
                for t, (name, stats) in enumerate(index.per_task.items())}
    return {"tasks": per_task, "frequent_ngrams_ignored": int(len(frequent))}


def frequent_of(ctx: Context) -> np.ndarray:
    return np.load(ctx.pass_dir("frequent") / "frequent.npy")
