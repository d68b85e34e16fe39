"""Locality-sensitive hashing of MinHash signatures: the (bands, rows) split datasketch's MinHashLSH
derives from a Jaccard threshold, and one 64-bit key per (document, band) for the band buckets."""
from __future__ import annotations

import functools

import numpy as np

from tasks.decontaminate.ngram_index import _fmix


def _false_positive(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad  # here: importing scipy.integrate costs every stage's start 0.5 s
    return quad(lambda s: 1 - (1 - s ** float(r)) ** float(b), 0.0, threshold)[0]


def _false_negative(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad
    return quad(lambda s: 1 - (1 - (1 - s ** float(r)) ** float(b)), threshold, 1.0)[0]


@functools.lru_cache(maxsize=64)
def optimal_bands(threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false-positive + false-negative probability mass, as
    datasketch's MinHashLSH does (its defaults weigh both 0.5)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    best, opt = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            err = fp_weight * _false_positive(threshold, b, r) + fn_weight * _false_negative(threshold, b, r)
            if err < best:
                best, opt = err, (b, r)
    return opt


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The chance that a pair of this Jaccard similarity shares a band: 1 - (1 - s^rows)^bands."""
    return 1.0 - (1.0 - similarity ** rows) ** bands


def recall_bands(threshold: float, num_perm: int, recall: float = 0.99) -> tuple[int, int]:
    """The (bands, rows) with the most rows (the fewest false candidates) that still find a pair at the
    threshold with probability `recall`; (num_perm, 1) when none does."""
    for r in range(num_perm, 0, -1):
        if candidate_probability(threshold, num_perm // r, r) >= recall:
            return num_perm // r, r
    return num_perm, 1


def band_keys(signatures: np.ndarray, bands: int, rows: int, first_band: int = 0) -> np.ndarray:
    """[documents, bands] uint64: a hash of each band's `rows` signature values (equal bands, equal
    keys; the band index, counted from `first_band`, is mixed in, so equal values in two bands give
    two keys)."""
    n, perms = signatures.shape
    if bands * rows > perms:
        raise ValueError(f"{bands} bands x {rows} rows need {bands * rows} permutations, the signatures have {perms}")
    sig = signatures[:, :bands * rows].astype(np.uint64).reshape(n, bands, rows)
    with np.errstate(over="ignore"):
        acc = np.broadcast_to(np.arange(first_band, first_band + bands, dtype=np.uint64) + np.uint64(1),
                              (n, bands)).copy()
        for j in range(rows):
            acc = _fmix(acc * np.uint64(0x9E3779B97F4A7C15) + sig[:, :, j])
    return acc
