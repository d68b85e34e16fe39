"""Code points and the token rules of the Gopher statistics (textstats.py): UTF-8 decoding, character
classes, span hashes (FNV-1a, 64 bits), and the spaCy-like rules for splitting punctuation, contractions
and abbreviations off a whitespace-separated chunk."""
from __future__ import annotations

import numba
import numpy as np

FNV_OFFSET, FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def fnv(word: str) -> int:
    h = 0xCBF29CE484222325
    for c in word:
        h = ((h ^ ord(c)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# abbreviations whose period spaCy keeps (lower-cased; a word with a period inside, "U.S.", keeps it too)
TITLES = ("mr", "mrs", "ms", "dr", "jr", "sr", "st", "prof", "vs", "inc", "ltd", "co", "mt")
TITLE_HASHES = np.array([fnv(w) for w in TITLES], dtype=np.uint64)


@numba.njit(cache=True, inline="always")
def is_space(c):
    return c == 32 or 9 <= c <= 13 or c == 0x85 or c == 0xA0 or c == 0x1680 or 0x2000 <= c <= 0x200A \
        or c == 0x2028 or c == 0x2029 or c == 0x202F or c == 0x205F or c == 0x3000 or 0x1C <= c <= 0x1F


@numba.njit(cache=True, inline="always")
def is_punct(c):
    if c < 128:
        return 33 <= c <= 47 or 58 <= c <= 64 or 91 <= c <= 96 or 123 <= c <= 126
    return 0xA1 <= c <= 0xBF or c == 0xD7 or c == 0xF7 or 0x2010 <= c <= 0x205E or 0x20A0 <= c <= 0x20CF \
        or 0x2100 <= c <= 0x2BFF or 0x3000 <= c <= 0x303F or 0xFF01 <= c <= 0xFF0F or 0xFF1A <= c <= 0xFF20 \
        or 0xFF3B <= c <= 0xFF40 or 0xFF5B <= c <= 0xFF65 or 0x1F000 <= c <= 0x1FAFF or c == 0xFFFD


@numba.njit(cache=True, inline="always")
def is_alpha(c):
    if c < 128:
        return 65 <= c <= 90 or 97 <= c <= 122
    return c >= 0xC0 and not is_punct(c) and not is_space(c)


@numba.njit(cache=True)
def decode_utf8(buf, lo, hi, out):  # pragma: no cover - compiled
    """UTF-8 bytes -> code points (Arrow strings are valid UTF-8); returns how many."""
    n, i = 0, lo
    while i < hi:
        b = np.int64(buf[i])
        if b < 0x80:
            cp, k = b, 1
        elif b < 0xE0:
            cp, k = b & 0x1F, 2
        elif b < 0xF0:
            cp, k = b & 0x0F, 3
        else:
            cp, k = b & 0x07, 4
        for j in range(1, k):
            if i + j < hi:
                cp = (cp << 6) | (np.int64(buf[i + j]) & 0x3F)
        out[n] = cp
        n += 1
        i += k
    return n


@numba.njit(cache=True)
def span_hash(cp, lo, hi):  # pragma: no cover - compiled
    h = FNV_OFFSET
    for i in range(lo, hi):
        h = (h ^ np.uint64(cp[i])) * FNV_PRIME
    return h


@numba.njit(cache=True, inline="always")
def is_letter(c):  # a letter, not a digit (the regex class [^\\W\\d_] spaCy's hyphen infix uses)
    return is_alpha(c)


@numba.njit(cache=True, inline="always")
def punct_run(cp, lo, hi):
    """Length of the token starting at lo: a run of 2+ identical . ' or - is one token, else 1 character."""
    c, k = cp[lo], 1
    if c == 46 or c == 39 or c == 45:
        while lo + k < hi and cp[lo + k] == c:
            k += 1
    return k


@numba.njit(cache=True, inline="always")
def punct_run_back(cp, lo, hi):
    """Length of the token ending at hi, as punct_run from the right (the run never reaches lo, a non-punctuation)."""
    c, k = cp[hi - 1], 1
    if c == 46 or c == 39 or c == 45:
        while hi - k - 1 > lo and cp[hi - k - 1] == c:
            k += 1
    return k


@numba.njit(cache=True, inline="always")
def ascii_lower(c):
    return c + 32 if 65 <= c <= 90 else c


@numba.njit(cache=True, inline="always")
def is_apostrophe(c):
    return c == 39 or c == 0x2019


@numba.njit(cache=True)
def contraction_length(cp, lo, hi):  # pragma: no cover - compiled
    """Length of a contraction ending cp[lo:hi] with something before it: 's 'm 'd (2), 'll 're 've n't (3)."""
    n = hi - lo
    if n >= 3 and is_apostrophe(cp[hi - 2]):
        x = ascii_lower(cp[hi - 1])
        if x == 115 or x == 109 or x == 100:
            return 2
    if n >= 4:
        x, y = ascii_lower(cp[hi - 2]), ascii_lower(cp[hi - 1])
        if is_apostrophe(cp[hi - 3]) and ((x == 108 and y == 108) or (x == 114 and y == 101) or (x == 118 and y == 101)):
            return 3
        if ascii_lower(cp[hi - 3]) == 110 and is_apostrophe(cp[hi - 2]) and y == 116:
            return 3
    return 0


@numba.njit(cache=True)
def keeps_period(cp, lo, hi):  # pragma: no cover - compiled
    """cp[lo:hi] + "." keeps its period: a period inside ("U.S") or a title ("Mr")."""
    h = FNV_OFFSET
    for k in range(lo, hi):
        if cp[k] == 46:
            return True
        h = (h ^ np.uint64(ascii_lower(cp[k]))) * FNV_PRIME
    for k in range(len(TITLE_HASHES)):
        if h == TITLE_HASHES[k]:
            return True
    return False

