"""Stage `decontaminate`: remove evaluation-task n-gram overlaps from training documents.

GPT-3 Appendix C, as MT-NLG used it:
  pass 1 (`decontaminate.count`, one shard task per input shard): for each task n-gram, the
          number of training documents containing it; n-grams in more than `max_doc_frequency`
          documents are ignored as too common to mean contamination.
  pass 2 (this stage's shards): each remaining match is removed with `margin_chars` on each side
          (widened to whole words), splitting the document; pieces shorter than `min_piece_chars`
          are dropped, and a document split into more than `max_pieces` pieces is dropped.
Pieces become documents with ids `<id>#<k>`; untouched documents pass through unchanged.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from tasks.config import PipelineParams
from tasks.eval_tasks import load_tasks
import pyarrow as pa

from tasks.ngram_index import DOC_SEP, HASH_VERSION, NgramIndex, normalize, token_spans, word_hashes
from tasks.schema import DOC_SCHEMA, DocWriter, iter_batches, text_bytes
from tasks.shards import Shard, ShardStats, StageLayout, atomic_path, atomic_write_text, prune

NAME = "decontaminate"


def stage_params(p: PipelineParams) -> dict:
    return {**p.decontaminate.model_dump(mode="json"), "benchmarks_dir": p.paths.benchmarks_dir}


def plan(p: PipelineParams, rt: dict, layout: StageLayout) -> list[Shard]:
    src = Path(p.paths.data_dir) / p.decontaminate.input_stage / "shards"
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no input; run the `{p.decontaminate.input_stage}` stage first")
    root = StageLayout(p.paths.data_dir, NAME).root
    # Pass 2 of a shard also depends on the task index (its key.json is rewritten only when the
    # index is), its pass-1 counts, and the corpus-wide frequent list.
    key, counts, frequent = root / "index" / "key.json", root / "count" / "shards", root / "frequent.npy"
    return [Shard(f.stem, (str(f), str(key), str(counts / f"{f.stem}.npz"), str(frequent)), f.name)
            for f in sorted(src.glob("*.parquet"))]


# ---- the task index, built once per stage run and loaded by every worker ------------------------

def _task_files_fingerprint(p: PipelineParams) -> list:
    root = Path(p.paths.benchmarks_dir)
    return sorted((str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns)
                  for f in root.rglob("*") if f.is_file()) if root.is_dir() else []


def ensure_index(p: PipelineParams, layout: StageLayout) -> Path:
    folder = layout.root / "index"
    d = p.decontaminate
    key = json.dumps([HASH_VERSION, d.tasks, d.n, d.min_n, _task_files_fingerprint(p)])
    if (folder / "key.json").exists() and (folder / "key.json").read_text() == key:
        return folder
    index = NgramIndex.build(load_tasks(d.tasks, p.paths.benchmarks_dir), d.n, d.min_n)
    (folder / "key.json").unlink(missing_ok=True)  # a kill while saving must not leave a valid key
    index.save(folder)
    atomic_write_text(folder / "key.json", key)
    return folder


@functools.lru_cache(maxsize=2)
def _load_index(folder: str, key: str) -> NgramIndex:  # key: reload when the index was rebuilt
    return NgramIndex.load(Path(folder))


def index_for(rt: dict) -> NgramIndex:
    folder = Path(rt["index_dir"])
    return _load_index(str(folder), (folder / "key.json").read_text())


def runtime_from_disk(p: PipelineParams) -> dict:
    """The index and frequent-n-gram list a finished run left in data/decontaminate."""
    root = StageLayout(p.paths.data_dir, NAME).root
    return {"index_dir": str(root / "index"), "frequent_path": str(root / "frequent.npy")}


def frequent_entries(rt: dict) -> np.ndarray:
    return np.load(rt["frequent_path"])


# ---- matching over batches of documents --------------------------------------------------------

def batch_hits(index: NgramIndex, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(document, first word, length, entry) of every match in a batch. The documents are joined
    with a separator word so one vectorised pass covers the batch and no window spans two."""
    h, first_byte = word_hashes(f" {DOC_SEP} ".join(normalize(t) for t in texts), first_bytes=True)
    sep = np.flatnonzero(first_byte == ord(DOC_SEP))  # normalisation removed any \x01 in the texts
    starts, ends = np.concatenate(([0], sep + 1)), np.concatenate((sep, [len(h)]))
    first, length, entry = index.matches(h)
    doc = np.searchsorted(starts, first, side="right") - 1
    inside = first + length <= ends[doc]  # windows touching a separator are not hits
    return doc[inside], (first - starts[doc])[inside], length[inside], entry[inside]


def batch_matches(index: NgramIndex, texts: list[str]) -> list[list[tuple[int, int, int]]]:
    """Per document, its (first word, length, entry) matches."""
    per_doc: list[list[tuple[int, int, int]]] = [[] for _ in texts]
    for d, f, n, e in zip(*(x.tolist() for x in batch_hits(index, texts))):
        per_doc[d].append((f, n, e))
    return per_doc


def count_shard(shard: Shard, tmp: Path, p: PipelineParams, rt: dict) -> ShardStats:
    """Pass 1: how many documents of this shard contain each task n-gram (sparse), and which rows
    have any match (pass 2 re-examines only those)."""
    index, st = index_for(rt), ShardStats()
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
        np.savez(fh, entries=entries, docs=docs.astype(np.int64), rows=matched_rows)
    st.docs_out = st.docs_in
    st.extra = {"docs_with_matches": int(len(matched_rows))}
    return st


class CountPass:
    """The first pass, registered as its own sharded step so it runs (and resumes) like any stage."""

    NAME = "decontaminate.count"
    LAYOUT = "decontaminate/count"
    stage_params = staticmethod(stage_params)
    process = staticmethod(count_shard)


def first_pass(p: PipelineParams, rt: dict, layout: StageLayout, shards: list[Shard], map_shards) -> dict:
    rt = {**rt, "index_dir": str(ensure_index(p, layout))}
    count_layout = StageLayout(p.paths.data_dir, CountPass.LAYOUT)
    count_layout.prepare()
    count_shards = [Shard(s.name, s.inputs[:2], f"{s.name}.npz") for s in shards]  # documents + index key
    map_shards(CountPass.NAME, p, count_shards, rt)
    prune(count_layout, count_shards)
    index = index_for(rt)
    docs = np.zeros(len(index.hashes), dtype=np.int64)
    for s in count_shards:
        with np.load(count_layout.output(s)) as z:
            np.add.at(docs, z["entries"], z["docs"])
    frequent = np.nonzero(docs > p.decontaminate.max_doc_frequency)[0]
    path = layout.root / "frequent.npy"
    if not path.exists() or not np.array_equal(np.load(path), frequent):  # unchanged: keep mtime for resume
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, frequent)
    per_task = {name: {**stats, "frequent_ngrams_ignored": int(np.count_nonzero(index.masks[frequent] & (1 << t)))}
                for t, (name, stats) in enumerate(index.per_task.items())}
    report = {"index_entries": int(len(index.hashes)), "index_bytes": index.nbytes(),
              "index_total_bytes": int(sum(index.nbytes().values())), "tasks": per_task,
              "frequent_ngrams_ignored": int(len(frequent))}
    return {**rt, "frequent_path": str(path), "count_dir": str(count_layout.shards), "report": report}


# ---- pass 2: removal ---------------------------------------------------------------------------

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


def process(shard: Shard, tmp: Path, p: PipelineParams, rt: dict) -> ShardStats:
    """Pass 2: rows pass 1 found no match in are copied as Arrow slices; matched rows are cut."""
    d, index, st = p.decontaminate, index_for(rt), ShardStats()
    frequent = set(frequent_entries(rt).tolist())
    with np.load(Path(rt["count_dir"]) / f"{shard.name}.npz") as z:
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
    kept = [x for x in pieces if len(x) >= d.min_piece_chars] if len(pieces) <= d.max_pieces else []
    removed = len(doc["text"]) - sum(len(x) for x in kept)
    outcome = "docs_split" if kept else "docs_dropped"
    tally["docs_matched"] += 1
    tally["chars_removed"] += removed
    if kept:
        tally["docs_split"] += 1
    else:
        st.drop("too_many_pieces" if len(pieces) > d.max_pieces else "no_piece_long_enough")
    for t in tasks:
        tally[f"{t}.docs_matched"] += 1
        tally[f"{t}.{outcome}"] += 1
        tally[f"{t}.chars_removed"] += removed
    tally["pieces_written"] += len(kept)
    return [{**doc, "id": f"{doc['id']}#{k}", "text": piece} for k, piece in enumerate(kept)]


def report(rt: dict, stats: dict) -> dict:
    """stats.json additions: the index, and per task its n-grams and what matching them did."""
    rep = json.loads(json.dumps(rt["report"]))
    extra = stats.get("extra", {})
    for name, row in rep["tasks"].items():
        for k in ("docs_matched", "docs_split", "docs_dropped", "chars_removed"):
            row[f"training_{k}"] = extra.get(f"{name}.{k}", 0)
    return rep
