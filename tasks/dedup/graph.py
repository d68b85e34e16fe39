"""Passes 3 and 4 of dedup.

buckets (sharded by band): for each LSH band, documents whose band of the signature is equal share
a bucket; each bucket of two or more is written as a sorted member list (CSR: members + starts).
Exact duplicates already removed and documents without words take no part.

components (global): each bucket links its members. Each member is compared with each of the
bucket's first `max_centers` members (all pairs, in buckets up to that size) that is not yet in its
component; with verification a pair is joined when the exact Jaccard of their shingle sets reaches the
threshold, without it every pair is (the star datatrove builds). The graph's connected components keep one document each, by dataset priority (MT-NLG)."""
from __future__ import annotations

from pathlib import Path

import numba
import numpy as np

from tasks.core import stopping
from tasks.core.config import PipelineParams
from tasks.core.passes import Shard, ShardStats, load_stored, savez
from tasks.core.stage import Context
from tasks.dedup.components import components, representatives
from tasks.dedup.exact import EXACT, FUZZY, doc_column, docs_of, layout_of
from tasks.dedup.lsh import band_keys
from tasks.dedup.minhash import shingle_sets
from tasks.dedup.signing import read, signature_files


def band_groups(p: PipelineParams) -> list[list[int]]:
    bands, _ = p.dedup.lsh()
    groups = p.dedup.band_shards or bands
    return [list(range(bands))[g::groups] for g in range(min(groups, bands))]


def plan_buckets(p: PipelineParams, ctx: Context) -> list[Shard]:
    files = tuple(str(f) for f in signature_files(ctx))
    return [Shard(f"bands-{g[0]:03d}", files, f"bands-{g[0]:03d}.npz") for g in band_groups(p)]


def bucket_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    _, rows = p.dedup.lsh()
    group = next(g for g in band_groups(p) if shard.name == f"bands-{g[0]:03d}")
    alive = np.asarray(doc_column(ctx, "has_words")) & (np.asarray(doc_column(ctx, "exact_dup_of")) < 0)
    keys = np.empty((len(alive), len(group)), dtype=np.uint64)
    at = 0
    for f in signature_files(ctx):
        stopping.check()  # an interrupted run stops this shard here
        sig = load_stored(f, "sig")  # mapped: only this group's bands are read (they are contiguous)
        for j, b in enumerate(group):
            keys[at:at + len(sig), j] = band_keys(np.asarray(sig[:, b * rows:(b + 1) * rows]), 1, rows, first_band=b)[:, 0]
        at += len(sig)
        del sig
    members, starts, total = [], [0], 0
    index = np.flatnonzero(alive)
    for j in range(len(group)):
        k = keys[index, j]
        order = np.argsort(k, kind="stable")  # stable: members stay in global-index order
        ks, idx = k[order], index[order]
        edge = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        lo, hi = np.concatenate([[0], edge]), np.concatenate([edge, [len(ks)]])
        big = (hi - lo) >= 2
        if big.any():
            sizes = (hi - lo)[big]
            members.append(idx[np.repeat(big, hi - lo)])  # the runs of two or more, in order
            starts.extend((total + np.cumsum(sizes)).tolist())
            total += int(sizes.sum())
    with open(tmp, "wb") as fh:
        savez(fh, members=np.concatenate(members) if members else np.zeros(0, np.int64),
                 starts=np.asarray(starts, dtype=np.int64))
    st = ShardStats(docs_in=int(alive.sum()), docs_out=int(alive.sum()))
    st.extra = {"buckets": len(starts) - 1, "bucket_members": total}
    return st


@numba.njit(cache=True, nogil=True)
def _find(parent, x):  # pragma: no cover - compiled
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@numba.njit(cache=True, nogil=True)
def _jaccard(sets, off, a, b):  # pragma: no cover - compiled
    i, ie, j, je = off[a], off[a + 1], off[b], off[b + 1]
    inter = 0
    while i < ie and j < je:
        if sets[i] == sets[j]:
            inter += 1
            i += 1
            j += 1
        elif sets[i] < sets[j]:
            i += 1
        else:
            j += 1
    union = (ie - off[a]) + (je - off[b]) - inter
    return inter / union if union > 0 else 1.0


# Rejected pairs remembered (direct-mapped, 32 MiB): a pair that fails the check collides in many bands, and
# each band checked it again (2.4 checks per distinct pair on templated pages, ~60% of the pass). Bounded, so
# a 1M-member template bucket does not grow a set of its 256M rejections; a slot overwritten costs a re-check.
REJECTED_BITS = 22


@numba.njit(cache=True, nogil=True)
def _link(n, members, starts, local, sets, off, threshold, max_centers, verify):  # pragma: no cover - compiled
    """Edges (u, v) that joined two components, and (pairs checked, pairs rejected). Each member of a
    bucket is compared with each of the bucket's first `max_centers` members that is not already in
    its component (all pairs in a bucket up to that size), joined on every verified match."""
    parent = np.arange(n)
    eu, ev = [0], [0]
    checked, rejected = 0, 0
    centres = np.empty(max_centers, dtype=np.int64)
    seen = np.full(1 << REJECTED_BITS, -1, dtype=np.int64)
    for q in range(len(starts) - 1):
        nc = 0
        for s in range(starts[q], starts[q + 1]):
            m = members[s]
            for c in range(nc):
                rm, rc = _find(parent, m), _find(parent, centres[c])
                if rc == rm:
                    continue  # joined already (through another member or band): nothing to check
                if verify:
                    a, b = local[m], local[centres[c]]
                    key = min(a, b) * n + max(a, b)
                    slot = (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - REJECTED_BITS)
                    if seen[slot] == key:
                        continue  # rejected in an earlier band: the same check fails again
                    checked += 1
                    if _jaccard(sets, off, a, b) < threshold:
                        rejected += 1
                        seen[slot] = key
                        continue
                parent[max(rm, rc)] = min(rm, rc)
                eu.append(m)
                ev.append(centres[c])
            if nc < max_centers:
                centres[nc] = m
                nc += 1
    out = np.empty((len(eu) - 1, 2), dtype=np.int64)
    for i in range(1, len(eu)):
        out[i - 1, 0], out[i - 1, 1] = eu[i], ev[i]
    return out, checked, rejected


def _candidate_sets(ctx: Context, candidates: np.ndarray, layout: dict) -> tuple[np.ndarray, np.ndarray]:
    """The shingle sets (sorted, unique) of the candidate documents only (sorted global indices), as one CSR."""
    parts, lens = [], []
    for f in signature_files(ctx):
        start, rows = layout["shards"][f.stem]
        mine = candidates[(candidates >= start) & (candidates < start + rows)] - start
        if not len(mine):
            continue
        sets, off = read(f, "shingles", "shingle_offsets")
        size = off[mine + 1] - off[mine]
        at = np.repeat(off[mine] - np.concatenate([[0], np.cumsum(size)[:-1]]), size) + np.arange(size.sum())
        parts.append(sets[at])
        lens.append(size)
    if not parts:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64)
    return shingle_sets(np.concatenate(parts), np.concatenate([[0], np.cumsum(np.concatenate(lens))]).astype(np.int64))


def build_components(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    d, docs, layout = p.dedup, docs_of(ctx), layout_of(ctx)
    n = len(docs["ids"])
    members, starts, at = [], [np.zeros(1, np.int64)], 0
    for f in sorted((ctx.pass_dir("buckets") / "shards").glob("*.npz")):
        m, s = read(f, "members", "starts")
        members.append(m)
        starts.append(s[1:] + at)
        at += len(m)
    members_all = np.concatenate(members) if members else np.zeros(0, np.int64)
    starts_all = np.concatenate(starts)
    candidates = np.unique(members_all)
    local = np.full(n, -1, dtype=np.int64)
    local[candidates] = np.arange(len(candidates))
    sets, off = _candidate_sets(ctx, candidates, layout) if d.verify else (np.zeros(0, np.uint32), np.zeros(1, np.int64))
    edges, checked, rejected = _link(n, members_all, starts_all, local, sets, off, d.threshold, d.max_centers, d.verify)
    labels = components(n, edges)
    keep = representatives(labels, docs["rank"])
    dup_of = docs["exact_dup_of"].copy()
    reason = np.where(dup_of >= 0, EXACT, 0).astype(np.int8)
    fuzzy = keep != np.arange(n)
    dup_of[fuzzy], reason[fuzzy] = keep[fuzzy], FUZZY
    exact = reason == EXACT  # an exact copy of a document removed as a fuzzy duplicate: point at the keeper
    dup_of[exact] = np.where(reason[dup_of[exact]] == FUZZY, dup_of[dup_of[exact]], dup_of[exact])
    with open(tmp / "removed.npz", "wb") as fh:
        savez(fh, dup_of=dup_of, reason=reason)
    return report(docs, layout, dup_of, reason, labels, {
        "candidate_docs": int(len(candidates)), "bucket_members": int(len(members_all)),
        "pairs_checked": int(checked), "pairs_rejected": int(rejected), "graph_edges": int(len(edges)),
        "lsh_bands": d.lsh()[0], "lsh_rows": d.lsh()[1]})


def report(docs: dict, layout: dict, dup_of: np.ndarray, reason: np.ndarray, labels: np.ndarray, extra: dict) -> dict:
    """Per dataset: documents, exact and fuzzy removals; the matrix of whose copies were removed in
    favour of whose (row: the removed copy's dataset, column: the kept document's)."""
    names, ds = layout["datasets"], docs["dataset"]
    removed = dup_of >= 0
    per = {name: {"docs": int((ds == i).sum()), "exact_removed": int(((ds == i) & (reason == EXACT)).sum()),
                  "fuzzy_removed": int(((ds == i) & (reason == FUZZY)).sum())} for i, name in enumerate(names)}
    matrix = np.zeros((len(names), len(names)), dtype=np.int64)
    np.add.at(matrix, (ds[removed], ds[dup_of[removed]]), 1)
    sizes = np.bincount(labels[reason != EXACT], minlength=len(labels)) if len(labels) else np.zeros(0, np.int64)
    return {"dedup": {"docs": int(len(dup_of)), "exact_removed": int((reason == EXACT).sum()),
                      "fuzzy_removed": int((reason == FUZZY).sum()),
                      "fuzzy_components": int((sizes >= 2).sum()), "largest_component": int(sizes.max(initial=0)),
                      **extra, "datasets": per,
                      "removed_in_favour_of": {a: {b: int(matrix[i, j]) for j, b in enumerate(names) if matrix[i, j]}
                                               for i, a in enumerate(names) if matrix[i].any()}}}


def removed_of(ctx: Context, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
    """The components' dup_of and reason, for `rows` only (memory-mapped: a shard's task reads its rows)."""
    path = ctx.pass_dir("components") / "removed.npz"
    return np.array(load_stored(path, "dup_of")[rows]), np.array(load_stored(path, "reason")[rows])
