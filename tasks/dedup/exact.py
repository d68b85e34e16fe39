"""Pass 2 of dedup (global): every document's place in the global index, its dataset and priority
rank, and exact duplicates of the normalised text removed first, each group keeping its member from
the highest-priority dataset (then the first in the input's order)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tasks.core.config import PipelineParams
from tasks.core.stage import Context
from tasks.dedup.components import representatives
from tasks.core.passes import load_stored, savez
from tasks.core.schema import CRAWL_DATASET
from tasks.dedup.signing import read, shard_datasets, signature_files

KEPT, EXACT, FUZZY = 0, 1, 2  # why a document is removed (reason codes)


def build_exact(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    names: dict[str, int] = {}
    ids, dataset, keys, has, shards = [], [], [], [], {}
    for f in signature_files(ctx):
        local = [names.setdefault(x, len(names)) for x in shard_datasets(f)]
        i, c, k, h = read(f, "ids", "codes", "exact", "has_words")
        shards[f.stem] = [int(sum(len(x) for x in ids)), int(len(i))]
        ids.append(i)
        dataset.append(np.asarray(local, dtype=np.int32)[c] if len(c) else np.zeros(0, np.int32))
        keys.append(k)
        has.append(h)
    ids_all = np.concatenate(ids) if ids else np.zeros(0, "S1")
    ds = np.concatenate(dataset) if dataset else np.zeros(0, np.int32)
    order = list(names)
    # unlisted: a curated dataset before the raw crawl (CC-MAIN-... shards sort before curated-..., so input
    # order kept the crawl's copy of an OpenWebText2 or Books3 document)
    last = len(p.dedup.priority)
    rank_of = {n: (p.dedup.priority.index(n) if n in p.dedup.priority else last + (n == CRAWL_DATASET)) for n in order}
    rank = np.array([rank_of[n] for n in order], dtype=np.int32)[ds] if len(ds) else np.zeros(0, np.int32)
    has_words = np.concatenate(has) if has else np.zeros(0, bool)
    dup_of = np.full(len(ids_all), -1, dtype=np.int64)
    if p.dedup.exact and has_words.any():
        members = np.flatnonzero(has_words)
        _, first = np.unique(np.concatenate(keys)[members], return_inverse=True)
        keep = members[representatives(first.ravel(), rank[members])]
        removed = keep != members
        dup_of[members[removed]] = keep[removed]
    with open(tmp / "docs.npz", "wb") as fh:
        savez(fh, ids=ids_all, dataset=ds, rank=rank, has_words=has_words, exact_dup_of=dup_of)
    (tmp / "shards.json").write_text(json.dumps({"datasets": order, "shards": shards}, indent=1) + "\n")
    return {"exact_removed": int((dup_of >= 0).sum()), "docs_without_words": int((~has_words).sum())}


def docs_of(ctx: Context) -> dict[str, np.ndarray]:
    with np.load(ctx.pass_dir("exact") / "docs.npz") as z:
        return {k: z[k] for k in z.files}


def doc_column(ctx: Context, name: str) -> np.ndarray:
    """One column of docs_of, memory-mapped: a per-shard task reads the pages it indexes, not every
    document's ids (8M documents: ~0.5 GB read by each of the shards' tasks, the pass growing as N^2)."""
    return load_stored(ctx.pass_dir("exact") / "docs.npz", name)


def layout_of(ctx: Context) -> dict:
    """{"datasets": names in code order, "shards": {shard: [first global index, rows]}}."""
    return json.loads((ctx.pass_dir("exact") / "shards.json").read_text(encoding="utf-8"))
