"""Expectations on `dedup`: the document schema with unique ids; the counts consistent with stats.json
(kept + removed = input, per dataset, and the removed documents are all in aside/); no kept document
is one the stage's components removed (or not of its shard); and a sampled
re-check: `recheck_docs` kept documents, each compared (exact Jaccard of shingle sets) with every kept
document it shares an LSH bucket with, finds no pair at or above the threshold."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.passes import load_stored
from tasks.core.stage import Context
from tasks.dedup.exact import doc_column, docs_of, layout_of
from tasks.dedup.graph import _candidate_sets, _jaccard, removed_of
from tasks.dedup.lsh import band_keys
from tasks.dedup.signing import signature_files
from tasks.validation import doc_checks

COLUMNS = ("kept_pair_above_threshold", "kept_but_removed")


def expectations() -> list:
    import great_expectations as gx

    return doc_checks.expectations(COLUMNS) + [
        gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0) for c in COLUMNS]


def totals_expectations() -> list:
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0)
            for c in ("count_mismatch", "removed_for_a_removed_copy", "removed_for_a_lower_priority_copy",
                      "stats_do_not_add_up")] + \
        doc_checks.shard_facts_expectations()


def totals(p, shards_dir: Path) -> dict:
    """Documents the output and aside/ hold against the stage's own counts: also when the output is empty."""
    stats = json.loads((Path(p.paths.data_dir) / "dedup" / "stats.json").read_text(encoding="utf-8"))
    return {"count_mismatch": count_mismatch(p, shards_dir), **keepers(p), **doc_checks.shard_facts(shards_dir),
            "stats_do_not_add_up": doc_checks.stats_do_not_add_up(stats)}


def keepers(p) -> dict:
    """Removed documents whose kept copy was removed too, or is from a dataset of lower priority (MT-NLG's rule:
    keep the copy of the highest-priority dataset): a components pass choosing the wrong keeper passed."""
    ctx = Context("dedup", str(p.paths.data_dir), p.dedup.input_stage)
    (dup_of, _), rank, ids = removed_of(ctx), doc_column(ctx, "rank"), doc_column(ctx, "ids")  # mapped: no id read
    removed = np.flatnonzero(dup_of >= 0)
    keeper = dup_of[removed]
    facts = {}
    for name, bad in (("removed_for_a_removed_copy", dup_of[keeper] >= 0),
                      ("removed_for_a_lower_priority_copy", rank[keeper] > rank[removed])):
        facts[name] = int(bad.sum())
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            facts[f"{name}_where"] = f"e.g. {ids[removed[i]].decode('utf-8')} for {ids[keeper[i]].decode('utf-8')}"
    return facts


@numba.njit(cache=True)
def _violations(pairs, local, sets, off, threshold):  # pragma: no cover - compiled
    out = np.zeros(len(pairs), dtype=np.bool_)
    for i in range(len(pairs)):
        out[i] = _jaccard(sets, off, local[pairs[i, 0]], local[pairs[i, 1]]) >= threshold
    return out


KEY_ROWS = 1 << 16  # signatures hashed into band keys at a time


def _bucket_mates(ctx: Context, kept: np.ndarray, sample: np.ndarray, bands: int, rows: int) -> list[list]:
    """Per band, (global indices, keys) of the kept documents whose key in that band is a sampled one's, read a
    chunk of signatures at a time: the whole [documents, bands] key table, and a copy, was ~600 bytes a document
    (2M documents: 1.2 GB beside a stage's 300 MB)."""
    files = signature_files(ctx)
    sampled, start = [], 0
    for f in files:
        sig = load_stored(f, "sig")
        here = sample[(sample >= start) & (sample < start + len(sig))] - start
        if len(here):
            sampled.append(band_keys(np.asarray(sig[here]), bands, rows))
        start += len(sig)
    wanted = np.concatenate(sampled) if sampled else np.zeros((0, bands), np.uint64)
    is_kept = np.zeros(start, dtype=bool)
    is_kept[kept] = True
    members: list[list] = [[] for _ in range(bands)]
    start = 0
    for f in files:
        sig = load_stored(f, "sig")
        for a in range(0, len(sig), KEY_ROWS):
            keys = band_keys(np.asarray(sig[a:a + KEY_ROWS]), bands, rows)
            idx = np.arange(start + a, start + a + len(keys))
            alive = is_kept[idx]
            for b in range(bands):
                hit = alive & np.isin(keys[:, b], wanted[:, b])
                if hit.any():
                    members[b].append((idx[hit], keys[hit, b]))
        start += len(sig)
    return members


def recheck(p, ctx: Context, docs: dict, dup_of: np.ndarray) -> dict[str, int]:
    """Id of each sampled kept document -> how many kept bucket mates are duplicates of it after all."""
    d, layout = p.dedup, layout_of(ctx)
    kept = np.flatnonzero((dup_of < 0) & docs["has_words"])
    if not len(kept) or not d.recheck_docs or not d.verify:  # without shingle sets there is nothing to re-check
        return {}
    rng = np.random.default_rng(d.seed)
    sample = np.sort(rng.choice(kept, size=min(d.recheck_docs, len(kept)), replace=False))
    bands, rows = d.lsh()
    members = _bucket_mates(ctx, kept, sample, bands, rows)
    # pairs as one int64 (low x n + high), deduplicated band by band; each sampled member meets at most
    # max_centers mates of a run, the stage's own bound: on templated pages (a third of a site's pages in each
    # band's bucket, none a duplicate) every pair of every band, deduplicated row-wise, took ~330 KB a page
    n, codes = np.int64(len(dup_of)), np.zeros(0, np.int64)
    for b in range(bands):
        if not members[b]:
            continue
        idx, k = np.concatenate([i for i, _ in members[b]]), np.concatenate([x for _, x in members[b]])
        order = np.argsort(k, kind="stable")  # stable: a run's members stay in global-index order
        ks, idx = k[order], idx[order]
        edge = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        band = []
        for lo, hi in zip(np.concatenate([[0], edge]), np.concatenate([edge, [len(ks)]])):
            if hi - lo > 1:
                run = idx[lo:hi]
                mine = run[np.isin(run, sample)]
                mates = run[:d.max_centers + 1]
                a, c = np.repeat(mine, len(mates)), np.tile(mates, len(mine))
                sel = a != c
                band.append(np.minimum(a[sel], c[sel]) * n + np.maximum(a[sel], c[sel]))
        if band:
            codes = np.unique(np.concatenate([codes, *band]))
    if not len(codes):
        return {}
    pairs = np.stack([codes // n, codes % n], axis=1)
    involved = np.unique(pairs)
    local = np.full(len(dup_of), -1, dtype=np.int64)
    local[involved] = np.arange(len(involved))
    sets, off = _candidate_sets(ctx, involved, layout)
    bad = pairs[_violations(pairs, local, sets, off, d.threshold)]
    sampled = set(sample.tolist())
    found = Counter(x for x in bad.ravel().tolist() if x in sampled)
    return {docs["ids"][i].decode("utf-8"): n for i, n in found.items()}


def count_mismatch(p, shards_dir: Path) -> int:
    """|documents per dataset in the output - (in the input - removed)| summed, plus the same for aside/."""
    stats = json.loads((Path(p.paths.data_dir) / "dedup" / "stats.json").read_text(encoding="utf-8"))["dedup"]
    out, aside = Counter(), Counter()
    for f in sorted(Path(shards_dir).glob("*.parquet")):
        out.update(pq.read_table(f, columns=["dataset"]).column("dataset").to_pylist())
    for f in sorted((Path(p.paths.data_dir) / "dedup" / "aside" / "shards").glob("*.parquet")):
        aside.update(pq.read_table(f, columns=["dataset"]).column("dataset").to_pylist())
    miss = 0
    for name, row in stats["datasets"].items():
        removed = row["exact_removed"] + row["fuzzy_removed"]
        miss += abs(out[name] - (row["docs"] - removed)) + abs(aside[name] - removed)
    return miss + sum(n for name, n in (out + aside).items() if name not in stats["datasets"])


def batches(p, shards_dir: Path):
    ctx = Context("dedup", str(p.paths.data_dir), p.dedup.input_stage)
    docs, (dup_of, _), layout = docs_of(ctx), removed_of(ctx), layout_of(ctx)
    found = recheck(p, ctx, docs, dup_of)

    def columns(table: pa.Table, shard: Path) -> dict:
        ids = table.column("id").to_pylist()
        # the shard's input rows (one output shard per input shard, of the same name) the components kept;
        # an id that is not one of them was removed, or is not this shard's
        first, rows = layout["shards"].get(shard.stem, (0, 0))
        here = slice(first, first + rows)
        kept = {i.decode("utf-8") for i in docs["ids"][here][dup_of[here] < 0]}
        return {"kept_pair_above_threshold": np.array([found.get(i, 0) for i in ids], dtype=np.int64),
                "kept_but_removed": np.array([i not in kept for i in ids], dtype=np.int64)}

    yield from doc_checks.batches(p, shards_dir, columns)
