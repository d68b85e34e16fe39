"""The statistics of the Gopher quality and repetition rules, for a batch of documents, in one compiled
pass over their UTF-8 bytes (datatrove computes them with spaCy's tokenizer and Python n-gram lists,
most of its filtering time; a byte loop needs neither).

Tokens follow spaCy's English tokenizer (what datatrove's Gopher filters count) closely enough for its
decisions: whitespace-separated chunks; leading and trailing punctuation split off one character per
token, except runs of "..", "''" and "--" (one token each) and the period of an abbreviation ("U.S.",
"Mr.", "J.": tokens.keeps_period; a number's or a domain's period is a token, "$3.99" "."); the
contractions 's 'm 'd 'll 're 've n't split off as words ("don't" is "do" "n't"); a URL is one token
("example.com/a-b-c"); a number and its unit are two ("100km", "10pm"); other words split at spaCy's
infixes (tokens.infix_length: "well-known", "555-1234", "km/h", "costs.So"). A word
is a token with a character that is not punctuation. On 6,300 real documents (LAMBADA, BoolQ, RACE, the
sample's crawl) GopherQualityFilter's decisions agree with these counts on 99% (whitespace words with one
punctuation token per side: 89% on LAMBADA's dialogue). Lengths are in code points, as Python's len(). Repetition elements (paragraphs,
lines, n-grams) are compared by 64-bit hashes; a collision needs ~2^32 distinct elements in one page.
"""
from __future__ import annotations

from pathlib import Path

import numba
import numpy as np

from tasks.core.numba_cache import recompile_when_changed
from tasks.filter.tokens import (FNV_PRIME, contraction_length, decode_utf8, fnv, infix_length, is_alpha, is_punct,
                                is_space, keeps_period, looks_like_url, punct_run, punct_run_back, span_hash,
                                unit_split)

# columns of the per-document statistics
(TOKENS, WORDS, WORD_CHARS, ALPHA_TOKENS, HASHES, ELLIPSES, LINES, BULLET_LINES, ELLIPSIS_LINES, STOP_WORDS,
 CHARS, CONTROL_CHARS, PARAS, DUP_PARAS, DUP_PARA_CHARS, NL_LINES, DUP_LINES, DUP_LINE_CHARS) = range(18)
N_FIXED = 18
STOP = ("the", "be", "to", "of", "and", "that", "have", "with")  # Gopher's stop words (case-sensitive)
STOP_HASHES = np.array([fnv(w) for w in STOP], dtype=np.uint64)


@numba.njit(cache=True)
def _seen(table, used, n_used, key):  # pragma: no cover - compiled
    """Insert `key` into the open-addressing set; returns (was it there, n_used)."""
    if key == 0:
        key = np.uint64(1)
    mask = len(table) - 1
    i = np.int64(key & np.uint64(mask))
    while True:
        if table[i] == key:
            return True, n_used
        if table[i] == 0:
            table[i] = key
            used[n_used] = i
            return False, n_used + 1
        i = (i + 1) & mask


@numba.njit(cache=True)
def _clear(table, used, n_used):  # pragma: no cover - compiled
    for k in range(n_used):
        table[used[k]] = 0


@numba.njit(cache=True)
def _dups(cp, starts, ends, n, table, used):  # pragma: no cover - compiled
    """(elements seen before, their characters) of the spans, as datatrove's find_duplicates."""
    dup, chars, n_used = 0, 0, 0
    for k in range(n):
        was, n_used = _seen(table, used, n_used, span_hash(cp, starts[k], ends[k]))
        if was:
            dup += 1
            chars += ends[k] - starts[k]
    _clear(table, used, n_used)
    return dup, chars


@numba.njit(cache=True)
def _split_newline_runs(cp, lo, hi, min_run, starts, ends):  # pragma: no cover - compiled
    """The spans of cp[lo:hi] between runs of at least `min_run` newlines, as re.split(r"\n{min_run,}")
    (empty leading / trailing elements included); returns how many. Unlike that regex (datatrove's), a
    line of whitespace alone ("\xa0" from a page's <p>&nbsp;</p> spacers, a space) is part of the run and
    "\r\n" is one newline: as elements of their own, the blank lines counted as duplicates and dropped
    clean posts and CRLF files as repetitive."""
    n, s, k = 0, lo, lo
    while k < hi:
        if cp[k] != 10:
            k += 1
            continue
        end = k - 1 if k > s and cp[k - 1] == 13 else k
        run, j = 0, k
        while j < hi and cp[j] == 10:
            run += 1
            j += 1
            t = j  # a whitespace-only line up to the next newline (or the end) belongs to the run
            while t < hi and cp[t] != 10 and is_space(cp[t]):
                t += 1
            if t == hi or cp[t] == 10:
                j = t
        if run >= min_run:
            starts[n], ends[n] = s, end
            n += 1
            s = j
        k = j
    starts[n], ends[n] = s, hi
    return n + 1


@numba.njit(cache=True)
def _token(cp, lo, hi, nt, row, stop_hashes, tok_h, tok_len):  # pragma: no cover - compiled
    """Record the token cp[lo:hi]; a word (a character that is not punctuation) adds to the word counts."""
    h = span_hash(cp, lo, hi)
    tok_h[nt], tok_len[nt] = h, hi - lo
    word, alpha = False, False
    for k in range(lo, hi):
        if not is_punct(cp[k]):
            word = True
        if is_alpha(cp[k]):
            alpha = True
    if word:
        row[WORDS] += 1
        row[WORD_CHARS] += hi - lo
        if alpha:
            row[ALPHA_TOKENS] += 1
        for k in range(len(stop_hashes)):
            if h == stop_hashes[k]:
                row[STOP_WORDS] = np.int64(row[STOP_WORDS]) | (1 << k)
    return nt + 1


@numba.njit(cache=True)
def _doc_stats(cp, m, row, top_ns, dup_ns, stop_hashes, tok_h, tok_len, starts, ends, table, used, counts):
    # pragma: no cover - compiled
    # ---- tokens (spaCy-like, see the module's doc) and the quality counts ----
    nt, i = 0, 0
    while i < m:
        if is_space(cp[i]):
            i += 1
            continue
        s, marks = i, False  # marks: a "." or ":" the chunk needs to be a URL (most words have neither)
        while i < m and not is_space(cp[i]):
            marks = marks or cp[i] == 46 or cp[i] == 58
            i += 1
        e, a = i, s
        while a < e and is_punct(cp[a]):  # prefixes, one per character (a run of . ' - as one)
            k = punct_run(cp, a, e)
            nt = _token(cp, a, a + k, nt, row, stop_hashes, tok_h, tok_len)
            a += k
        if a == e:
            continue
        scheme = marks and looks_like_url(cp, a, e)  # "https://x.org/": its closing "/" stays, as in spaCy
        b, nc = e, 0  # suffixes, right to left; their starts go to `starts` (free until the paragraphs)
        while b > a:
            c = cp[b - 1]
            if is_punct(c):
                if c == 47 and scheme:
                    break
                k = punct_run_back(cp, a, b)
                if k == 1 and c == 46 and b - 1 > a and keeps_period(cp, a, b - 1):
                    break
            else:
                k = contraction_length(cp, a, b)
                if k == 0:
                    break
            b -= k
            starts[nc] = b
            nc += 1
        p, q = a, a  # the word, split at infixes (none in a URL; a number and its unit are two tokens)
        whole = scheme or (marks and looks_like_url(cp, a, b))
        u = 0 if whole else unit_split(cp, a, b)
        if u > 0:
            nt = _token(cp, a, u, nt, row, stop_hashes, tok_h, tok_len)
            p = u
        q = b if whole or u > 0 else a
        while q < b:
            k = infix_length(cp, a, b, q) if is_punct(cp[q]) else 0  # every infix is punctuation
            if k == 0:
                q += 1
                continue
            if q > p:
                nt = _token(cp, p, q, nt, row, stop_hashes, tok_h, tok_len)
            nt = _token(cp, q, q + k, nt, row, stop_hashes, tok_h, tok_len)
            q += k
            p = q
        if b > p:
            nt = _token(cp, p, b, nt, row, stop_hashes, tok_h, tok_len)
        for x in range(nc - 1, -1, -1):
            nt = _token(cp, starts[x], e if x == 0 else starts[x - 1], nt, row, stop_hashes, tok_h, tok_len)
    row[TOKENS] = nt
    bits = np.int64(row[STOP_WORDS])
    row[STOP_WORDS] = 0
    for k in range(len(stop_hashes)):
        row[STOP_WORDS] += (bits >> k) & 1
    row[CHARS] = m
    k = 0
    while k < m:
        c = cp[k]
        if c == 35:
            row[HASHES] += 1
        elif c == 0x2026:
            row[ELLIPSES] += 1
        elif c == 46 and k + 2 < m and cp[k + 1] == 46 and cp[k + 2] == 46:
            row[ELLIPSES] += 1
            k += 2
        elif (c < 32 and c != 9 and c != 10 and c != 13) or c == 0xFFFD or 0x7F <= c <= 0x9F:
            row[CONTROL_CHARS] += 1
        k += 1
    # ---- str.splitlines(): bullets and ellipsis endings ----
    s = 0
    while s < m:
        e = s
        while e < m and not (cp[e] == 10 or cp[e] == 13 or cp[e] == 11 or cp[e] == 12 or 0x1C <= cp[e] <= 0x1E
                             or cp[e] == 0x85 or cp[e] == 0x2028 or cp[e] == 0x2029):
            e += 1
        row[LINES] += 1
        a = s
        while a < e and is_space(cp[a]):
            a += 1
        if a < e and (cp[a] == 0x2022 or cp[a] == 45):
            row[BULLET_LINES] += 1
        b = e
        while b > s and is_space(cp[b - 1]):
            b -= 1
        if b > s and (cp[b - 1] == 0x2026 or (b - s >= 3 and cp[b - 1] == 46 and cp[b - 2] == 46 and cp[b - 3] == 46)):
            row[ELLIPSIS_LINES] += 1
        s = e + (2 if e + 1 < m and cp[e] == 13 and cp[e + 1] == 10 else 1)
    # ---- paragraphs: text.strip() split on \n{2,} (blank lines of whitespace too, _split_newline_runs) ----
    lo, hi = 0, m
    while lo < hi and is_space(cp[lo]):
        lo += 1
    while hi > lo and is_space(cp[hi - 1]):
        hi -= 1
    n = _split_newline_runs(cp, lo, hi, 2, starts, ends)
    row[PARAS] = n
    row[DUP_PARAS], row[DUP_PARA_CHARS] = _dups(cp, starts, ends, n, table, used)
    # ---- lines: text split on \n+ (leading / trailing empty elements included, as re.split; _split_newline_runs) ----
    n = _split_newline_runs(cp, 0, m, 1, starts, ends)
    row[NL_LINES] = n
    row[DUP_LINES], row[DUP_LINE_CHARS] = _dups(cp, starts, ends, n, table, used)
    # ---- n-grams over the tokens ----
    col = N_FIXED
    for q in range(len(top_ns)):  # the most frequent n-gram's " ".join length x its count
        g = top_ns[q]
        best = 0
        if nt >= g:
            n_used = 0
            for t in range(nt - g + 1):
                key = np.uint64(0)
                for j in range(g):
                    key = key * FNV_PRIME + tok_h[t + j]
                key = key | np.uint64(1)
                idx = np.int64(key & np.uint64(len(table) - 1))
                while table[idx] != 0 and table[idx] != key:
                    idx = (idx + 1) & (len(table) - 1)
                if table[idx] == 0:
                    table[idx] = key
                    used[n_used] = idx
                    n_used += 1
                counts[idx] += 1
                starts[t] = idx
            top = 0
            for t in range(nt - g + 1):
                top = max(top, counts[starts[t]])
            for t in range(nt - g + 1):  # ties: the first seen, as Counter.most_common
                if counts[starts[t]] == top:
                    length = g - 1
                    for j in range(g):
                        length += tok_len[t + j]
                    best = length * top
                    break
            for k in range(n_used):
                counts[used[k]] = 0
            _clear(table, used, n_used)
        row[col] = best
        col += 1
    for q in range(len(dup_ns)):  # characters of repeated n-grams, skipping past each, as datatrove
        g = dup_ns[q]
        rep, n_used, t = 0, 0, 0
        while t < nt - g + 1:
            key = np.uint64(0)
            length = 0
            for j in range(g):
                key = key * FNV_PRIME + tok_h[t + j]
                length += tok_len[t + j]
            was, n_used = _seen(table, used, n_used, key)
            if was:
                rep += length
                t += g
            else:
                t += 1
        _clear(table, used, n_used)
        row[col] = rep
        col += 1


@numba.njit(cache=True)
def _batch(buf, offsets, top_ns, dup_ns, stop_hashes, out):  # pragma: no cover - compiled
    longest = 1
    for d in range(len(offsets) - 1):
        longest = max(longest, offsets[d + 1] - offsets[d])
    cp = np.empty(longest + 1, dtype=np.int64)
    tok_h = np.empty(longest + 1, dtype=np.uint64)
    tok_len = np.empty(longest + 1, dtype=np.int64)
    starts = np.empty(longest + 2, dtype=np.int64)
    ends = np.empty(longest + 2, dtype=np.int64)
    size = 16
    while size < 2 * (longest + 2):
        size *= 2
    table = np.zeros(size, dtype=np.uint64)
    used = np.empty(longest + 2, dtype=np.int64)
    counts = np.zeros(size, dtype=np.int64)
    for d in range(len(offsets) - 1):
        m = decode_utf8(buf, offsets[d], offsets[d + 1], cp)
        _doc_stats(cp, m, out[d], top_ns, dup_ns, stop_hashes, tok_h, tok_len, starts, ends, table, used, counts)


def text_stats(texts, top_ns, dup_ns) -> np.ndarray:
    """Per document (rows) the columns above, then the top n-gram characters for each n of `top_ns`,
    then the repeated n-gram characters for each n of `dup_ns`. `texts` is an Arrow string array."""
    import pyarrow as pa

    arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    arr = arr.cast(pa.large_string())
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    buf = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    out = np.zeros((len(arr), N_FIXED + len(top_ns) + len(dup_ns)), dtype=np.float64)
    if len(arr):
        _batch(buf, offsets.astype(np.int64), np.asarray(top_ns, np.int64), np.asarray(dup_ns, np.int64),
               STOP_HASHES, out)
    return out


# their compiled code holds tokens.py's rules, which numba's cache does not watch (tasks.core.numba_cache)
recompile_when_changed((_seen, _clear, _dups, _split_newline_runs, _token, _doc_stats, _batch),
                       [Path(__file__).with_name("tokens.py")])
