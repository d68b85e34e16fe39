"""Connected components of the duplicate graph and the document each keeps: MT-NLG's rule, "a priority
order based on the quality of the datasets when selecting a representative document from the duplicate
documents in each connected component". The representative is the member from the highest-priority
dataset, ties broken by the input's order (shards by name, then rows: the first seen, as NeMo Curator
keeps the first; deterministic whatever the edge order)."""
from __future__ import annotations

import numpy as np


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Component label (the smallest member index) of each of `n` nodes, from an [m, 2] edge array:
    union-find with path halving, vectorised over the edges in rounds (no Python loop per edge)."""
    parent = np.arange(n, dtype=np.int64)
    if len(edges):
        u, v = edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64)
        while True:
            # point every node at its root (pointer jumping), then hook the larger root under the smaller
            while True:
                grand = parent[parent]
                if np.array_equal(grand, parent):
                    break
                parent = grand
            ru, rv = parent[u], parent[v]
            differ = ru != rv
            if not differ.any():
                break
            lo, hi = np.minimum(ru[differ], rv[differ]), np.maximum(ru[differ], rv[differ])
            np.minimum.at(parent, hi, lo)
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


def representatives(labels: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """For each node, the index of the node its component keeps: lowest `priority` value first (0 =
    highest-quality dataset), then the smallest node index, the input's order. (Not the smallest id:
    ids end in unpadded row numbers, and ".../134" sorts before ".../14", which kept a later copy.)"""
    order = np.lexsort((np.arange(len(labels)), priority, labels))  # by component, then priority, then index
    first = np.ones(len(order), dtype=bool)
    first[1:] = labels[order][1:] != labels[order][:-1]
    keep = np.empty(len(labels), dtype=np.int64)
    starts = np.flatnonzero(first)
    keeper = np.repeat(order[starts], np.diff(np.append(starts, len(order))))
    keep[order] = keeper
    return keep
