"""Text to MinHash in one compiled pass per batch (word shingles): the same values as
tasks.dedup.minhash's vectorised numpy path (tests compare them, and both with datasketch), ~2x faster
end to end because nothing is materialised per word or per shingle except each document's shingle set.

Per document, one loop over its bytes: ASCII bytes are lowercased and punctuation dropped through a
256-entry table (exactly `normalize` for ASCII text; other documents are normalised in Python first,
which the table leaves unchanged); each word's hash is decontamination's word hash; a ring of the last
n word hashes gives each shingle's hash; each shingle updates the signature (affine32, datasketch's
permutations) and is recorded (the document's shingles in order; the verification sorts the few
candidates' into sets); the running polynomial of the word
hashes gives the exact-duplicate key. Measured by `python -m benchmarks.dedup`."""
from __future__ import annotations

import numba
import numpy as np

from tasks.decontaminate.ngram_index import _ASCII_DROP, _WHITESPACE_BYTES, normalize_other, without_typography
from tasks.dedup.minhash import EMPTY, permutations

_TABLE = np.arange(256, dtype=np.uint8)
_TABLE[[c for c in _ASCII_DROP]] = 0  # dropped (0 itself is punctuation: never a kept byte)
_TABLE[ord("A"):ord("Z") + 1] += 32
_VALUE = np.where(_TABLE == 0, -1, np.where(_WHITESPACE_BYTES, 0, _TABLE.astype(np.int32) + 1)).astype(np.int32)


@numba.njit(inline="always")
def _fmix64(x):  # pragma: no cover - compiled
    x ^= x >> numba.uint64(33)
    x *= numba.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> numba.uint64(33)
    x *= numba.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> numba.uint64(33))


@numba.njit(inline="always")
def _fmix32(h):  # pragma: no cover - compiled
    h ^= h >> numba.uint32(16)
    h = numba.uint32(h * numba.uint32(0x85EBCA6B))
    h ^= h >> numba.uint32(13)
    h = numba.uint32(h * numba.uint32(0xC2B2AE35))
    return h ^ (h >> numba.uint32(16))


@numba.njit(inline="always")
def _emit(wh, row, a, b, sets, pos):  # pragma: no cover - compiled
    h32 = numba.uint32(wh & numba.uint64(0xFFFFFFFF))
    m = _fmix32(h32)
    for k in range(len(a)):  # branch-free uint32: vectorises (SIMD)
        row[k] = min(row[k], numba.uint32(numba.uint32(a[k] * m) + b[k]))
    sets[pos] = h32


@numba.njit(cache=True, nogil=True)
def _sign(buf, starts, value, n, a, b, sig, exact, words, sets, set_offsets):  # pragma: no cover
    """value[byte]: -1 dropped, 0 whitespace, else the normalised byte + 1. Per document: its word
    hashes in one tight loop over the bytes, then its shingles, signature and exact key over them."""
    P = numba.uint64(0x100000001B3)
    B = numba.uint64(0x9E3779B97F4A7C15)
    Bn1 = numba.uint64(1)
    for _ in range(n - 1):
        Bn1 *= B
    longest = 0
    for d in range(len(starts) - 1):
        longest = max(longest, starts[d + 1] - starts[d])
    wh = np.empty(longest // 2 + 1, dtype=np.uint64)
    ring = np.zeros(n, dtype=np.uint64)
    pos = 0
    for d in range(len(starts) - 1):
        nw, acc, pk = 0, numba.uint64(0), numba.uint64(1)  # pk != 1: inside a word (P**k is never 1 here)
        for i in range(starts[d], starts[d + 1]):
            v = value[buf[i]]
            if v > 0:
                acc += numba.uint64(v) * pk
                pk *= P
            elif v == 0 and pk != 1:
                wh[nw] = acc
                nw += 1
                acc, pk = numba.uint64(0), numba.uint64(1)
        if pk != 1:
            wh[nw] = acc
            nw += 1
        row = sig[d]
        r = 0
        win = numba.uint64(0)  # sum of the last n word hashes h_j * B**(n - 1 - j): a rolling polynomial
        key, pw = numba.uint64(0), B
        for j in range(nw):
            h = _fmix64(wh[j])
            key += h * pw
            pw *= B
            if j >= n:
                win -= ring[r] * Bn1
            win = win * B + h
            ring[r] = h
            r += 1
            if r == n:
                r = 0
            if j + 1 >= n:
                _emit(_fmix64(win * B + numba.uint64(n)), row, a, b, sets, pos)
                pos += 1
        if 0 < nw < n:  # shorter than a shingle: the whole document is one shingle
            _emit(_fmix64(win * B + numba.uint64(nw)), row, a, b, sets, pos)
            pos += 1
        words[d] = nw
        exact[d] = _fmix64(key * B + numba.uint64(nw)) if nw else numba.uint64(0)
        set_offsets[d + 1] = pos
    return pos


def _kernel_bytes(text: str) -> bytes:
    """What _sign reads: ASCII it lowercases and strips itself (typographic marks removed first, the same
    words), else normalize's words."""
    b = without_typography(text)
    return b if b is not None else normalize_other(text).encode("utf-8")


def sign_words(texts: list[str], n: int = 5, num_perm: int = 128, seed: int = 1):
    """(signatures [docs, num_perm] uint32, exact keys uint64, word counts, shingle hashes uint32 in
    document order, their offsets int64) of word n-gram shingles: shingle_hashes' layout."""
    parts = [t.encode("ascii") if t.isascii() else _kernel_bytes(t) for t in texts]
    lengths = np.fromiter((len(x) for x in parts), dtype=np.int64, count=len(parts))
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    a, b = permutations(num_perm, seed)
    sig = np.full((len(texts), num_perm), EMPTY, dtype=np.uint32)
    exact = np.zeros(len(texts), dtype=np.uint64)
    words = np.zeros(len(texts), dtype=np.int64)
    sets = np.empty(len(buf) // 2 + len(texts) + 1, dtype=np.uint32)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    used = _sign(buf, starts, _VALUE, n, a, b, sig, exact, words, sets, offsets)
    return sig, exact, words, sets[:used].copy(), offsets
