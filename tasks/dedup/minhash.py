"""MinHash signatures of many documents per call, bit-identical to datasketch's
`MinHash(num_perm, seed, hashfunc=shingle_hash32)` with its default `affine32` scheme.

Shingles are word n-grams (default 5) of the normalised text (lowercase, punctuation removed, split on
whitespace: decontamination's normalisation, so both stages see the same words). A shingle's 32-bit
hash is the low half of decontamination's 64-bit n-gram hash (a murmur finaliser over the words'
hashes), computed in bulk with numpy for a whole batch of documents at once. A document with fewer
words than the shingle size is one shingle of all its words (two identical short documents still
match); character shingles (`unit="char"`) are windows over the normalised text with single spaces,
a character's hash being fmix64(code point + 1), folded into windows the same way; a document
without words has no shingle and the empty signature (every value 2**32 - 1).

datasketch's affine32 scheme, compiled (numba; one pass, no [shingles, num_perm] block): each shingle
hash h is pre-mixed by the 32-bit MurmurHash3 finaliser, then permutation k maps it to a_k * h + b_k mod 2**32 (a_k odd; a_k, b_k drawn from
numpy's RandomState(seed) as datasketch draws them); the signature is the minimum per permutation.
"""
from __future__ import annotations

import numba
import numpy as np

from tasks.decontaminate.ngram_index import _WHITESPACE_BYTES, DOC_SEP, _fmix, normalize, window_hashes

EMPTY = np.uint32(0xFFFFFFFF)
_F1, _F2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 (a, b): a odd, both uint32, drawn in that order from RandomState(seed)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def fmix32(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = h * _F1
        h = h ^ (h >> np.uint32(13))
        h = h * _F2
        return h ^ (h >> np.uint32(16))


@numba.njit(cache=True, nogil=True)
def _word_hashes(b, space):  # pragma: no cover - compiled
    """The decontamination stage's word hash (ngram_index.word_hashes), one byte at a time:
    fmix64(sum_k (byte_k + 1) * P**k) per whitespace-separated word; ~10x faster than its numpy form."""
    out = np.empty(len(b) // 2 + 1, dtype=np.uint64)
    n, acc, pk, inside = 0, numba.uint64(0), numba.uint64(1), False
    p = numba.uint64(0x100000001B3)
    for i in range(len(b)):
        if space[b[i]]:
            if inside:
                out[n] = acc
                n += 1
                inside = False
        else:
            if not inside:
                acc, pk, inside = numba.uint64(0), numba.uint64(1), True
            acc += (numba.uint64(b[i]) + numba.uint64(1)) * pk
            pk *= p
    if inside:
        out[n] = acc
        n += 1
    h = out[:n]
    for i in range(n):
        x = h[i]
        x ^= x >> numba.uint64(33)
        x *= numba.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> numba.uint64(33)
        x *= numba.uint64(0xC4CEB9FE1A85EC53)
        h[i] = x ^ (x >> numba.uint64(33))
    return h


def word_hashes(text: str) -> np.ndarray:
    return _word_hashes(np.frombuffer(text.encode("utf-8"), dtype=np.uint8), _WHITESPACE_BYTES)


def _unit_hashes(texts: list[str], unit: str) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit hash of every unit (word, or character of the whitespace-collapsed text) of every
    normalised document, and the document each belongs to."""
    if not texts:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    if unit == "char":  # a character's hash: fmix64(code point + 1); words joined by one space
        parts = [np.frombuffer(" ".join(normalize(t).split()).encode("utf-32-le"), dtype=np.uint32) for t in texts]
        h64 = _fmix(np.concatenate(parts).astype(np.uint64) + np.uint64(1))
        return h64, np.repeat(np.arange(len(texts)), [len(x) for x in parts])
    h64 = word_hashes(f" {DOC_SEP} ".join(normalize(t) for t in texts))
    # the separator (which normalisation removes from the texts) is a word of its own: document boundaries
    is_sep = h64 == word_hashes(DOC_SEP)[0]
    return h64[~is_sep], np.cumsum(is_sep)[~is_sep]


def shingle_hashes(texts: list[str], n: int = 5, unit: str = "word") -> tuple[np.ndarray, np.ndarray]:
    """(uint32 hash of every shingle of every document, the index of each document's first shingle,
    one more entry at the end). Shingles are n-grams of words (or characters); documents are
    normalised and hashed in one pass over their bytes."""
    h64, doc = _unit_hashes(texts, unit)
    units = np.bincount(doc, minlength=len(texts))
    full = window_hashes(h64, n)
    starts = np.flatnonzero(doc[:len(full)] == doc[n - 1:]) if len(full) else np.empty(0, np.int64)
    per_doc = np.bincount(doc[starts], minlength=len(texts)) if len(starts) else np.zeros(len(texts), np.int64)
    hashes = full[starts]
    short = np.flatnonzero((units > 0) & (units < n))
    if len(short):  # shorter than a shingle: the whole document is one shingle, put in its place
        first_unit = np.concatenate([[0], np.cumsum(units)])
        whole = np.array([window_hashes(h64[first_unit[d]:first_unit[d + 1]], int(units[d]))[0] for d in short],
                         dtype=np.uint64)
        per_doc[short] = 1
        at = np.concatenate([[0], np.cumsum(per_doc)])[short]
        hashes = np.insert(hashes, at - np.arange(len(short)), whole)
    offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
    return (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32), offsets


def shingle_sets(hashes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each document's shingle hashes as a sorted set (what exact Jaccard compares), same layout."""
    doc = np.repeat(np.arange(len(offsets) - 1, dtype=np.uint64), np.diff(offsets))
    keyed = np.sort((doc << np.uint64(32)) | hashes.astype(np.uint64))  # sort + diff: numpy 2's hashing
    keyed = keyed[np.concatenate([[True], keyed[1:] != keyed[:-1]])] if len(keyed) else keyed  # unique is ~8x slower
    counts = np.bincount((keyed >> np.uint64(32)).astype(np.int64), minlength=len(offsets) - 1)
    return (keyed & np.uint64(0xFFFFFFFF)).astype(np.uint32), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _min_permuted(mixed, offsets, a, b, out):  # pragma: no cover - compiled
    """out[d, k] = min over document d's shingles h of a[k] * h + b[k] (uint32, wrapping)."""
    for d in range(len(offsets) - 1):
        row = out[d]
        for s in range(offsets[d], offsets[d + 1]):
            h = mixed[s]
            for k in range(len(a)):  # branch-free and in uint32 so it vectorises (SIMD)
                row[k] = min(row[k], numba.uint32(numba.uint32(a[k] * h) + b[k]))


def signatures_of(hashes: np.ndarray, offsets: np.ndarray, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """[documents, num_perm] uint32 MinHash signatures of shingle hashes laid out as shingle_hashes gives them."""
    a, b = permutations(num_perm, seed)
    sig = np.full((len(offsets) - 1, num_perm), EMPTY, dtype=np.uint32)
    _min_permuted(fmix32(hashes), offsets, a, b, sig)
    return sig


def signatures(texts: list[str], num_perm: int = 128, seed: int = 1, n: int = 5, unit: str = "word") -> np.ndarray:
    """[documents, num_perm] uint32 MinHash signatures (word shingles: the compiled one-pass path)."""
    if unit == "word":
        from tasks.dedup.fused import sign_words

        return sign_words(texts, n, num_perm, seed)[0]
    return signatures_of(*shingle_hashes(texts, n, unit), num_perm, seed)
