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


# abbreviations whose period spaCy keeps (lower-cased; its tokenizer exceptions), beside the shapes of keeps_period
TITLES = ("mr", "mrs", "ms", "dr", "jr", "sr", "st", "prof", "vs", "inc", "ltd", "co", "mt")
TITLE_HASHES = np.array([fnv(w) for w in TITLES], dtype=np.uint64)
# spaCy's UNITS (spacy/lang/char_classes.py, the Latin ones): split off a number they follow ("100km" is 2 tokens)
UNITS = ("km", "km²", "km³", "m", "m²", "m³", "dm", "dm²", "dm³", "cm", "cm²", "cm³", "mm", "mm²", "mm³", "ha", "µm",
         "nm", "yd", "in", "ft", "kg", "g", "mg", "µg", "t", "lb", "oz", "m/s", "km/h", "kmh", "mph", "hPa", "Pa",
         "mbar", "mb", "MB", "kb", "KB", "gb", "GB", "tb", "TB", "T", "G", "M", "K")
UNIT_HASHES = np.array([fnv(w) for w in UNITS], dtype=np.uint64)
CLOCK_HASHES = np.array([fnv(w) for w in ("am", "pm", "AM", "PM")], dtype=np.uint64)  # its "1am" ... "12pm" exceptions
AND_OR = np.array([ord(c) for c in "and/or"], dtype=np.int64)  # its one exception with an infix "/"


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


@numba.njit(cache=True, inline="always")
def is_digit(c):
    return 48 <= c <= 57


@numba.njit(cache=True, inline="always")
def is_upper(c):  # ASCII and Latin-1 capitals (the rules below ask it of the letter before a period)
    return 65 <= c <= 90 or (0xC0 <= c <= 0xDE and c != 0xD7)


@numba.njit(cache=True, inline="always")
def is_lower(c):
    return 97 <= c <= 122 or (0xDF <= c <= 0xFF and c != 0xF7)


@numba.njit(cache=True)
def keeps_period(cp, lo, hi):  # pragma: no cover - compiled
    """cp[lo:hi] + "." keeps its period, as spaCy's suffix rules and exceptions decide: a letter ("J.",
    "a."), a capital after anything but a capital ("U.S.", "Ph.D.", "iPhoneX."), single letters between
    periods ("e.g.", "a.m.") or a title ("Mr."). After a digit or a lower-case letter ("$3.99.", "v2.1.",
    "example.com.") or two capitals ("USA.") the period is a token of its own, and ends a sentence."""
    n = hi - lo
    if n == 1:
        return is_alpha(cp[lo])
    if is_upper(cp[hi - 1]) and not is_upper(cp[hi - 2]):
        return True
    dotted = n % 2 == 1
    for k in range(n):
        if (k % 2 == 0 and not is_alpha(cp[lo + k])) or (k % 2 == 1 and cp[lo + k] != 46):
            dotted = False
    if dotted:
        return True
    h = FNV_OFFSET
    for k in range(lo, hi):
        h = (h ^ np.uint64(ascii_lower(cp[k]))) * FNV_PRIME
    for k in range(len(TITLE_HASHES)):
        if h == TITLE_HASHES[k]:
            return True
    return False


@numba.njit(cache=True)
def unit_split(cp, lo, hi):  # pragma: no cover - compiled
    """Where a number ends and the unit spaCy splits off it begins ("100km", "5GB", "10pm"); 0 if none."""
    d = lo
    while d < hi and is_digit(cp[d]):
        d += 1
    if d == lo or d == hi:
        return 0
    h = span_hash(cp, d, hi)
    for k in range(len(UNIT_HASHES)):
        if h == UNIT_HASHES[k]:
            return d
    if d - lo <= 2:
        hour = (cp[lo] - 48) * 10 + cp[lo + 1] - 48 if d - lo == 2 else cp[lo] - 48
        if 1 <= hour <= 12:
            for k in range(len(CLOCK_HASHES)):
                if h == CLOCK_HASHES[k]:
                    return d
    return 0


@numba.njit(cache=True)
def looks_like_url(cp, lo, hi):  # pragma: no cover - compiled
    """spaCy's URL match, roughly: a scheme ("https://"), "www.", or a host of letters, digits and
    hyphens ending in "." and a lower-case top-level domain ("example.com/a-b", "user@mail-host.com").
    A URL is one token: no infix splits it."""
    if hi - lo >= 4 and cp[lo] == 119 and cp[lo + 1] == 119 and cp[lo + 2] == 119 and cp[lo + 3] == 46:
        return True
    for k in range(lo, hi - 2):
        if cp[k] == 58 and cp[k + 1] == 47 and cp[k + 2] == 47:
            return True
    end = hi  # the host ends at the path, query or fragment
    for k in range(lo, hi):
        if cp[k] == 47 or cp[k] == 63 or cp[k] == 35:
            end = k
            break
    start = lo
    for k in range(lo, end):
        if cp[k] == 64:
            start = k + 1
    last_dot = -1
    for k in range(start, end):
        c = cp[k]
        if c == 46:
            if k == start or k - 1 == last_dot:
                return False
            last_dot = k
        elif not (is_digit(c) or 65 <= c <= 90 or 97 <= c <= 122 or c == 45):
            return False
    if last_dot < 0 or end - last_dot - 1 < 2:
        return False
    for k in range(last_dot + 1, end):
        if not 97 <= cp[k] <= 122:
            return False
    return True


@numba.njit(cache=True)
def infix_length(cp, lo, hi, q):  # pragma: no cover - compiled
    """Length of the infix token at cp[q] inside the word cp[lo:hi] (0 if none): spaCy's infixes, "…",
    runs of ".." and "--"; a hyphen, en or em dash or ~ after a letter or digit and before a letter
    ("well-known", "3-year"; not "COVID-19"); + - * ^ between digits ("555-1234", "2-0"); : < > = / after
    a letter or digit and before a letter ("km/h", "N/A"; not "and/or"); a comma between letters; a
    period between a lower-case letter and a capital ("costs.So"; not in an abbreviation, "Ph.D.")."""
    c = cp[q]
    if c == 0x2026:
        return 1
    if (c == 46 or c == 45) and q + 1 < hi and cp[q + 1] == c:
        return punct_run(cp, q, hi)
    if q == lo or q + 1 >= hi:
        return 0
    before, after = cp[q - 1], cp[q + 1]
    if (c == 45 or c == 0x2013 or c == 0x2014 or c == 126) and (is_alpha(before) or is_digit(before)) \
            and is_alpha(after):
        return 1
    if (c == 43 or c == 45 or c == 42 or c == 94) and is_digit(before) and (is_digit(after) or after == 45):
        return 1
    if (c == 58 or c == 60 or c == 62 or c == 61 or c == 47) and (is_alpha(before) or is_digit(before)) \
            and is_alpha(after):
        if c == 47 and hi - lo == len(AND_OR):
            same = True
            for k in range(len(AND_OR)):
                if ascii_lower(cp[lo + k]) != AND_OR[k]:
                    same = False
            if same:
                return 0
        return 1
    if c == 44 and is_alpha(before) and is_alpha(after):
        return 1
    if c == 46 and cp[hi - 1] != 46 and (is_lower(before) or before == 39 or before == 34) and is_upper(after):
        return 1
    return 0
