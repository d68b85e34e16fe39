"""The last pass of decontamination: each remaining match is removed with `margin_chars` on each
side (widened to whole words), splitting the document; pieces shorter than `min_piece_chars` are
dropped, and a document split into more than `max_pieces` pieces is dropped. Pieces become
documents with ids `<id>#<k>`; untouched documents pass through unchanged."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.core.config import PipelineParams
from tasks.core.passes import Shard, ShardStats
from tasks.core.schema import DOC_SCHEMA, DocWriter, iter_batches, text_bytes
from tasks.core.stage import Context, input_files, shard_per_file
from tasks.decontaminate.counting import count_file, frequent_of, index_of
from tasks.decontaminate.matching import batch_matches
from tasks.decontaminate.ngram_index import NgramIndex, token_spans


def cut_ranges(text: str, hits: list[tuple[int, int, int]], margin: int) -> list[tuple[int, int]]:
    """Character ranges to remove: each match plus `margin` each side, widened to whole words."""
    words = []  # overlapping windows (a 50-word passage gives 38) merge into one word interval
    for first, end in sorted((f, f + n) for f, n, _ in hits):
        if words and first <= words[-1][1]:
            words[-1][1] = max(words[-1][1], end)
        else:
            words.append([first, end])
    spans = token_spans(text, upto=words[-1][1])
    ranges = []
    for first, end in words:
        a, b = max(0, spans[first][0] - margin), min(len(text), spans[end - 1][1] + margin)
        while a > 0 and not text[a - 1].isspace():
            a -= 1
        while b < len(text) and not text[b].isspace():
            b += 1
        ranges.append((a, b))
    ranges.sort()
    merged = [ranges[0]]
    for a, b in ranges[1:]:
        if a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def split_document(text: str, ranges: list[tuple[int, int]]) -> list[str]:
    """The non-empty text between the removed ranges."""
    edges = [0] + [x for r in ranges for x in r] + [len(text)]
    pieces = (text[edges[i]:edges[i + 1]].strip() for i in range(0, len(edges), 2))
    return [x for x in pieces if x]


def plan_remove(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(input_files(ctx))


def remove_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    """Rows the count pass found no match in are copied as Arrow slices; matched rows are cut."""
    d, index, st = p.decontaminate, index_of(ctx), ShardStats()
    frequent = set(frequent_of(ctx).tolist())
    with np.load(count_file(ctx, shard.name)) as z:
        flagged = np.asarray(z["rows"], dtype=np.int64)
    tally = {f"{t}.{k}": 0 for t in index.task_names for k in ("docs_matched", "docs_split", "docs_dropped", "chars_removed")}
    tally.update(docs_matched=0, docs_split=0, chars_removed=0, pieces_written=0)
    row = 0
    with DocWriter(tmp) as w:
        for batch in iter_batches(Path(shard.inputs[0]), None, d.batch_docs):
            table = pa.Table.from_batches([batch])
            st.docs_in += table.num_rows
            st.bytes_in += text_bytes(table)
            mine = (flagged[(flagged >= row) & (flagged < row + table.num_rows)] - row).tolist()
            row += table.num_rows
            docs = {i: table.slice(i, 1).to_pylist()[0] for i in mine}
            hits_of = dict(zip(mine, batch_matches(index, [docs[i]["text"] for i in mine])))
            parts, prev = [], 0
            for i in mine:
                parts.append(table.slice(prev, i - prev))
                hits = [h for h in hits_of[i] if h[2] not in frequent]
                pieces = _remove(docs[i], hits, index, d, st, tally) if hits else [docs[i]]
                parts.append(pa.Table.from_pylist(pieces, schema=DOC_SCHEMA))
                prev = i + 1
            parts.append(table.slice(prev))
            w.write_table(pa.concat_tables(parts))
    st.docs_out, st.bytes_out, st.extra = w.docs, w.text_bytes, tally
    return st


def _remove(doc: dict, hits: list, index: NgramIndex, d, st: ShardStats, tally: dict) -> list[dict]:
    """Cut every match out of one document; return the surviving pieces; account per task."""
    mask = int(np.bitwise_or.reduce(index.masks[[e for _, _, e in hits]]))
    tasks = [t for k, t in enumerate(index.task_names) if mask & (1 << k)]
    pieces = split_document(doc["text"], cut_ranges(doc["text"], hits, d.margin_chars))
    long_enough = [x for x in pieces if len(x) >= d.min_piece_chars]
    # the pieces counted are those kept, as Megatron's filter_ngrams counts them (what MT-NLG ran): a document
    # with many matches close together leaves a few long pieces and many short ones, and was dropped whole
    kept = long_enough if len(long_enough) <= d.max_pieces else []
    removed = len(doc["text"]) - sum(len(x) for x in kept)
    outcome = "docs_split" if kept else "docs_dropped"
    tally["docs_matched"] += 1
    tally["chars_removed"] += removed
    if kept:
        tally["docs_split"] += 1
    else:
        st.drop("too_many_pieces" if len(long_enough) > d.max_pieces else "no_piece_long_enough")
    for t in tasks:
        tally[f"{t}.docs_matched"] += 1
        tally[f"{t}.{outcome}"] += 1
        tally[f"{t}.chars_removed"] += removed
    tally["pieces_written"] += len(kept)
    return [{**doc, "id": f"{doc['id']}#{k}", "text": piece} for k, piece in enumerate(kept)]


def report(stats: dict) -> dict:
    """stats.json additions: per task, what matching its n-grams did to the training documents."""
    tasks = json.loads(json.dumps(stats.get("tasks", {})))
    extra = stats.get("extra", {})
    for name, row in tasks.items():
        for k in ("docs_matched", "docs_split", "docs_dropped", "chars_removed"):
            row[f"training_{k}"] = extra.get(f"{name}.{k}", 0)
    return {"tasks": tasks}
