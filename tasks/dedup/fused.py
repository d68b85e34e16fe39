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

from tasks.decontaminate.ngram_index import _ASCII_DROP, _WHITESPACE_BYTES, normalize
from tasks.dedup.minhash import EMPTY, permutations

_TABLE = np.arange(256, dtype=np.uint8)
_TABLE[[c for c in _ASCII_DROP]] = 0  # dropped (0 itself is punctuation: never a kept byte)
_TABLE[ord("A"):ord("Z") + 1] += 32
_KIND = np.where(_TABLE == 0, 0, np.where(_WHITESPACE_BYTES, 1, 2)).astype(np.uint8)


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
def _sign(buf, starts, table, kind, n, a, b, sig, exact, words, sets, set_offsets):  # pragma: no cover
    """kind[byte]: 0 dropped, 1 whitespace, 2 part of a word (table[byte]: its normalised value)."""
    P = numba.uint64(0x100000001B3)
    B = numba.uint64(0x9E3779B97F4A7C15)
    Bn1 = numba.uint64(1)
    for _ in range(n - 1):
        Bn1 *= B
    ring = np.zeros(n, dtype=np.uint64)
    pos = 0
    for d in range(len(starts) - 1):
        row = sig[d]
        cnt, r = 0, 0
        win = numba.uint64(0)  # sum of the last n word hashes h_j * B**(n - 1 - j): a rolling polynomial
        key, pw = numba.uint64(0), B
        acc, pk, inside = numba.uint64(0), numba.uint64(1), False
        for i in range(starts[d], starts[d + 1] + 1):
            end_word = i == starts[d + 1]
            if not end_word:
                c = buf[i]
                k = kind[c]
                if k == 0:
                    continue  # dropped punctuation: the word goes on
                if k == 1:
                    end_word = True
                else:
                    if not inside:
                        acc, pk, inside = numba.uint64(0), numba.uint64(1), True
                    acc += (numba.uint64(table[c]) + numba.uint64(1)) * pk
                    pk *= P
            if end_word and inside:
                inside = False
                h = _fmix64(acc)
                key += h * pw
                pw *= B
                if cnt >= n:
                    win -= ring[r] * Bn1
                win = win * B + h
                ring[r] = h
                r += 1
                if r == n:
                    r = 0
                cnt += 1
                if cnt >= n:
                    _emit(_fmix64(win * B + numba.uint64(n)), row, a, b, sets, pos)
                    pos += 1
        if 0 < cnt < n:  # shorter than a shingle: the whole document is one shingle
            _emit(_fmix64(win * B + numba.uint64(cnt)), row, a, b, sets, pos)
            pos += 1
        words[d] = cnt
        exact[d] = _fmix64(key * B + numba.uint64(cnt)) if cnt else numba.uint64(0)
        set_offsets[d + 1] = pos
    return pos


def sign_words(texts: list[str], n: int = 5, num_perm: int = 128, seed: int = 1):
    """(signatures [docs, num_perm] uint32, exact keys uint64, word counts, shingle hashes uint32 in
    document order, their offsets int64) of word n-gram shingles: shingle_hashes' layout."""
    parts = [t.encode("ascii") if t.isascii() else normalize(t).encode("utf-8") for t in texts]
    lengths = np.fromiter((len(x) for x in parts), dtype=np.int64, count=len(parts))
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    a, b = permutations(num_perm, seed)
    sig = np.full((len(texts), num_perm), EMPTY, dtype=np.uint32)
    exact = np.zeros(len(texts), dtype=np.uint64)
    words = np.zeros(len(texts), dtype=np.int64)
    sets = np.empty(len(buf) // 2 + len(texts) + 1, dtype=np.uint32)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    used = _sign(buf, starts, _TABLE, _KIND, n, a, b, sig, exact, words, sets, offsets)
    return sig, exact, words, sets[:used].copy(), offsets
