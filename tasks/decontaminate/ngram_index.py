"""A compact, deterministic index of evaluation-task n-grams, and vectorised matching against it.

Normalisation (GPT-3 App. C): lowercase, split on whitespace, remove punctuation (and symbols,
underscore) from each word; words that become empty vanish. Each word is hashed from its UTF-8
bytes with numpy (no per-word Python), windows of word hashes are hashed again, and a murmur
finaliser mixes the result: 64-bit values that are the same in every process.

Index entries: every N-gram of each evaluation text, and for texts of MIN_N..N-1 words the whole
text as one n-gram (as Megatron's filter does). Short entries are found through their first MIN_N
words (a second, small table), then confirmed at full length. A bitmap prefilter keeps the sorted
lookup off the hot path. Memory: 8 bytes per entry + a 2-byte task mask + the bitmap.
"""
from __future__ import annotations

import functools
import json
import re
import unicodedata
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from tasks.evalsets.loaders import TaskData

PUNCT = re.compile(r"[^\w\s]|_")
KEPT_TOKEN = re.compile(r"\S*?[^\W_]\S*")  # exactly the whitespace tokens that survive PUNCT removal
B = np.uint64(0x9E3779B97F4A7C15)
M1, M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
DOC_SEP = "\x01"  # never survives normalisation, so it can mark document boundaries in a batch
_P = 0x100000001B3  # byte weight base (odd)
_BLOCK = 1 << 21
HASH_VERSION = 3  # part of the on-disk index key: change it when any hash above changes


# For ASCII text str.translate is ~2x faster than the regex and removes exactly the same chars.
_ASCII_DROP = {c: None for c in range(128) if PUNCT.match(chr(c))}
_ASCII_DROP_BYTES = bytes(_ASCII_DROP)
_NON_ASCII_PUNCT = re.compile(r"[^\w\s\x00-\x7f]")  # PUNCT's non-ASCII part (`_` is ASCII)


_WHITESPACE_BYTES = np.zeros(256, dtype=bool)  # str.isspace() for ASCII: \t\n\v\f\r, \x1c-\x1f, space
_WHITESPACE_BYTES[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True


# The non-ASCII characters of most English web text: typographic punctuation and spaces. Each is
# punctuation to normalize (gone) or whitespace (a word break) whichever path it takes (NFKC first or not),
# so replacing them in the UTF-8 bytes (C's memchr speed) leaves the words as they were, and a page whose
# only non-ASCII characters they are takes the ASCII path (~5x faster; dedup's compiled one, ~8x).
_TYPOGRAPHIC_SPACES = "\u00a0\u2002\u2003\u2009\u200a\u202f\u2028\u3000"  # no-break, en, em, thin, hair, ...
_TYPOGRAPHIC_MARKS = ("\u2019\u2018\u201c\u201d\u2013\u2014\u2026\u2022\u00b7\u00ab\u00bb\u00a9\u00ae"
                      "\u00b0\u00a7\u00b6\u2020\u2021\u2032\u2033\u2010\u2011\u2012\u2015\u2039\u203a"
                      "\u00a1\u00bf\u201a\u201e\u00ad\u200b\ufeff\u20ac\u00a3\u00a5\u00a2\u00d7")
_TYPOGRAPHIC = {**{c: b" " for c in _TYPOGRAPHIC_SPACES}, **{c: b"" for c in _TYPOGRAPHIC_MARKS}}
_ASCII_BYTES = bytes(range(128))


def without_typography(text: str) -> bytes | None:
    """`text`'s UTF-8 bytes with typographic punctuation removed and typographic spaces made ASCII spaces,
    when those are its only non-ASCII characters (the same words as normalize(text)); else None."""
    b = text.encode("utf-8", "surrogatepass")
    rest = b.translate(None, _ASCII_BYTES)
    if len(rest) > len(b) // 8:  # another script's text, not English with its typography: the Python path at once
        return None
    others = set(rest.decode("utf-8", "surrogatepass"))  # a page's few distinct ones
    if not others.issubset(_TYPOGRAPHIC):
        return None
    for c in others:
        b = b.replace(c.encode("utf-8"), _TYPOGRAPHIC[c])
    return b


def normalize(text: str) -> str:
    """Lowercased, punctuation removed. Words are separated by ASCII whitespace (any amount, as
    word_hashes splits on it); non-ASCII text is re-joined with single spaces because its
    whitespace may be multi-byte (no-break space, em space, ...). Text not in Unicode's NFKC form
    (decomposed accents, ligatures, full-width letters) is brought to it word by word first."""
    if text.isascii():
        return text.lower().translate(_ASCII_DROP)
    if (b := without_typography(text)) is not None:
        return b.lower().decode("ascii").translate(_ASCII_DROP)
    return normalize_other(text)


def normalize_other(text: str) -> str:
    """normalize() of a text that has non-ASCII characters other than typographic ones."""
    t = text.lower()
    if t.isascii():  # (the Kelvin sign, say: lower-cased to k)
        return t.translate(_ASCII_DROP)
    if _word_by_word(text, t):
        return " ".join(w for w in map(_nfkc_word, text.split()) if w)
    # PUNCT.sub in two steps, ~10% faster (what pays for the NFKC check): ASCII punctuation by a C
    # byte translate, then a regex that matches only the rarer non-ASCII punctuation
    t = t.encode("utf-8", "surrogatepass").translate(None, _ASCII_DROP_BYTES).decode("utf-8", "surrogatepass")
    return " ".join(_NON_ASCII_PUNCT.sub("", t).split())


# NFKC, one whitespace token at a time, so that a token stays one word and token_spans can say where it is:
# "café" typed as e + U+0301 lost its accent as punctuation ("cafe"), "ﬁrst" was another word than "first",
# so such copies were neither duplicates nor contamination. A space NFKC brings inside a token (U+00A8) goes.
_NOT_WORD = re.compile(r"\W|_")


def _nfkc_word(token: str) -> str:
    return _NOT_WORD.sub("", unicodedata.normalize("NFKC", token).lower())


def _word_by_word(text: str, lowered: str) -> bool:
    """Whether normalize takes `text` a token at a time through NFKC (non-ASCII text not in NFKC form); token_spans
    asks the same, so that its spans are those of normalize's words."""
    return not lowered.isascii() and not unicodedata.is_normalized("NFKC", text)


def words_of(text: str) -> list[str]:
    return normalize(text).split()


_TOKEN = re.compile(r"\S+")


def token_spans(text: str, upto: int | None = None) -> list[tuple[int, int]]:
    """Character span, in the original text, of each word of words_of(text) (the first `upto`)."""
    if _word_by_word(text, text.lower()):
        it = (m for m in _TOKEN.finditer(text) if _nfkc_word(m.group()))
    else:
        it = KEPT_TOKEN.finditer(text)
    return [m.span() for m in (it if upto is None else islice(it, upto))]


def _fmix(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint64(33)
    h *= M1
    h ^= h >> np.uint64(33)
    h *= M2
    h ^= h >> np.uint64(33)
    return h


def word_hashes(normalized: str, first_bytes: bool = False):
    """64-bit hash of each whitespace-separated word: fmix(sum_k (byte_k + 1) * P**k), k = offset
    in the word. Computed in bulk: byte k at position i weighs P**i, a word's sum is scaled back by
    P**-start (P is odd, so invertible mod 2**64), in blocks that end at whitespace. With
    `first_bytes`, also each word's first byte (to find separator tokens)."""
    b = np.frombuffer(normalized.encode("utf-8"), dtype=np.uint8)
    space = _WHITESPACE_BYTES[b]
    if space.all():
        empty = np.empty(0, dtype=np.uint64)
        return (empty, np.empty(0, dtype=np.uint8)) if first_bytes else empty
    starts = _word_starts(space)
    h = _hash_words(b, space, starts)
    return (h, b[starts]) if first_bytes else h


def _word_starts(space: np.ndarray) -> np.ndarray:
    start = ~space
    start[1:] &= space[:-1]
    return np.flatnonzero(start)


def _hash_words(b: np.ndarray, space: np.ndarray, starts: np.ndarray) -> np.ndarray:
    pw, inv = _powers()
    with np.errstate(over="ignore"):
        if np.diff(np.append(starts, len(b))).max() > _BLOCK // 2:  # a giant token: per-byte offsets
            is_start = np.zeros(len(b), dtype=bool)
            is_start[starts] = True
            offset = np.arange(len(b)) - starts[np.cumsum(is_start) - 1]
            contrib = (b.astype(np.uint64) + np.uint64(1)) * pw[offset & (_BLOCK - 1)]
            contrib[space] = 0
            return _fmix(np.add.reduceat(contrib, starts))
        out, lo = [], 0
        while lo < len(b):
            hi = len(b)
            if hi - lo > _BLOCK:  # end the block at a space in its second half: no word is cut
                hi = lo + _BLOCK // 2 + int(np.flatnonzero(space[lo + _BLOCK // 2: lo + _BLOCK])[-1])
            s0, s1 = np.searchsorted(starts, [lo, hi])
            seg = starts[s0:s1] - lo
            contrib = (b[lo:hi].astype(np.uint64) + np.uint64(1)) * pw[:hi - lo]
            contrib[space[lo:hi]] = 0
            out.append(np.add.reduceat(contrib, seg) * inv[seg])
            lo = hi
        return _fmix(np.concatenate(out))


@functools.lru_cache(maxsize=1)
def _powers() -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i mod 2**64 for i < _BLOCK (16 MiB each, built once per process)."""
    pw = np.full(_BLOCK, _P, dtype=np.uint64)
    inv = np.full(_BLOCK, pow(_P, -1, 1 << 64), dtype=np.uint64)
    pw[0] = inv[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(pw, dtype=np.uint64), np.cumprod(inv, dtype=np.uint64)


def window_hashes(h: np.ndarray, length: int) -> np.ndarray:
    """Hash of every window of `length` word hashes (len(h) - length + 1 of them)."""
    m = len(h) - length + 1
    if m <= 0:
        return np.empty(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        acc = np.zeros(m, dtype=np.uint64)
        for j in range(length):
            acc = acc * B + h[j:j + m]
        return _fmix(acc * B + np.uint64(length))


def _windows_at(h: np.ndarray, firsts: np.ndarray, length: int) -> np.ndarray:
    """window_hashes(h, length) at the windows starting at `firsts` only."""
    with np.errstate(over="ignore"):
        acc = np.zeros(len(firsts), dtype=np.uint64)
        for j in range(length):
            acc = acc * B + h[firsts + j]
        return _fmix(acc * B + np.uint64(length))


def _task_entries(texts: list[str], n: int, min_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A task's index entries, its short texts' prefixes and each text's word count, for all texts in
    one vectorised pass (per text, numpy's call overhead was ~90% of the build): the texts are joined
    with a separator word as in matching, and windows that touch a separator are dropped. Entries per
    text: every n-gram; a text of min_n..n-1 words: the whole text, and its first min_n words as prefix."""
    empty = np.empty(0, dtype=np.uint64)
    if not texts:
        return empty, empty, np.zeros(0, dtype=np.int64)
    h, first_byte = word_hashes(f" {DOC_SEP} ".join(normalize(t) for t in texts), first_bytes=True)
    sep = np.flatnonzero(first_byte == ord(DOC_SEP))  # normalisation removed any \x01 in the texts
    starts, ends = np.concatenate(([0], sep + 1)), np.concatenate((sep, [len(h)]))
    counts = ends - starts
    grams = window_hashes(h, n)
    first = np.arange(len(grams))
    entries = [grams[first + n <= ends[np.searchsorted(starts, first, side="right") - 1]]]  # inside their text
    short = np.flatnonzero((counts >= min_n) & (counts < n))
    for length in np.unique(counts[short]).tolist():
        whole = short[counts[short] == length]
        entries.append(_windows_at(h, starts[whole], length))
    prefixes = _windows_at(h, starts[short], min_n)
    # the order of entries does not matter: build sorts them
    return np.concatenate(entries), prefixes, counts


@dataclass
class NgramIndex:
    n: int
    min_n: int
    task_names: list[str]
    hashes: np.ndarray  # sorted unique uint64: n-grams and whole short texts
    masks: np.ndarray  # uint16 per hash: bit t set if task t has this n-gram
    prefixes: np.ndarray  # sorted unique uint64: first min_n words of each short text
    short_lengths: np.ndarray  # the lengths (min_n..n-1) that short entries have
    bitmap: np.ndarray  # uint8 bit array over hash values, a prefilter for `hashes`
    per_task: dict[str, dict[str, int]]

    def __post_init__(self) -> None:
        self.prefix_bitmap = _bitmap(self.prefixes)

    @classmethod
    def build(cls, tasks: list[TaskData], n: int = 13, min_n: int = 8) -> "NgramIndex":
        hashes, owners, prefixes, lengths = [], [], [], set()
        per_task = {}
        for t, task in enumerate(tasks):
            h, pre, counts = _task_entries(list(task.decontam_texts()), n, min_n)
            short = counts[(counts >= min_n) & (counts < n)]
            lengths.update(short.tolist())
            per_task[task.name] = {"texts": len(counts), "ngrams": 0, "short_texts": len(short),
                                   "texts_too_short": int(np.count_nonzero(counts < min_n))}
            hashes.append(h)
            owners.append(np.full(len(h), 1 << t, dtype=np.uint16))
            prefixes.append(pre)
        allh = np.concatenate(hashes) if hashes else np.empty(0, np.uint64)
        allo = np.concatenate(owners) if owners else np.empty(0, np.uint16)
        order = np.argsort(allh, kind="stable")
        allh, allo = allh[order], allo[order]
        uniq, first = np.unique(allh, return_index=True)
        masks = np.bitwise_or.reduceat(allo, first) if len(allo) else np.empty(0, np.uint16)
        for t, task in enumerate(tasks):
            per_task[task.name]["ngrams"] = int(np.count_nonzero(masks & (1 << t)))
        pref = np.unique(np.concatenate(prefixes)) if prefixes else np.empty(0, np.uint64)
        return cls(n, min_n, [t.name for t in tasks], uniq, masks, pref,
                   np.array(sorted(lengths), dtype=np.int64), _bitmap(uniq), per_task)

    def nbytes(self) -> dict[str, int]:
        return {"hashes": self.hashes.nbytes, "task_masks": self.masks.nbytes,
                "prefixes": self.prefixes.nbytes, "bitmap": self.bitmap.nbytes}

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("hashes", "masks", "prefixes"):
            np.save(folder / f"{name}.npy", getattr(self, name))
        meta = {"n": self.n, "min_n": self.min_n, "task_names": self.task_names,
                "short_lengths": self.short_lengths.tolist(), "per_task": self.per_task}
        (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> "NgramIndex":
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        hashes = np.load(folder / "hashes.npy")
        return cls(meta["n"], meta["min_n"], meta["task_names"], hashes, np.load(folder / "masks.npy"),
                   np.load(folder / "prefixes.npy"), np.array(meta["short_lengths"], dtype=np.int64),
                   _bitmap(hashes), meta["per_task"])

    def _lookup(self, h: np.ndarray) -> np.ndarray:
        """Entry position of each hash, or -1."""
        out = np.full(len(h), -1, dtype=np.int64)
        if not len(h) or not len(self.hashes):
            return out
        cand = np.flatnonzero(_maybe_in(self.bitmap, h))
        if len(cand):
            pos = np.minimum(np.searchsorted(self.hashes, h[cand]), len(self.hashes) - 1)
            ok = self.hashes[pos] == h[cand]
            out[cand[ok]] = pos[ok]
        return out

    def matches(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first word, length, entry) arrays for every window of word hashes `w` in the index."""
        firsts, lens, entries = [], [], []
        entry = self._lookup(window_hashes(w, self.n))
        hit = np.flatnonzero(entry >= 0)
        firsts.append(hit), lens.append(np.full(len(hit), self.n)), entries.append(entry[hit])
        if len(self.prefixes) and len(w) >= self.min_n:
            p = window_hashes(w, self.min_n)
            cand = np.flatnonzero(_maybe_in(self.prefix_bitmap, p))
            pos = np.minimum(np.searchsorted(self.prefixes, p[cand]), len(self.prefixes) - 1)
            cand = cand[self.prefixes[pos] == p[cand]]
            for length in self.short_lengths.tolist():  # confirm candidates at each short length
                c = cand[cand + length <= len(w)]
                if not len(c):
                    continue
                e = self._lookup(_windows_at(w, c, length))
                ok = e >= 0
                firsts.append(c[ok]), lens.append(np.full(int(ok.sum()), length)), entries.append(e[ok])
        return np.concatenate(firsts), np.concatenate(lens), np.concatenate(entries)


def _maybe_in(bitmap: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Bitmap test: False means certainly absent."""
    byte = bitmap[(h >> np.uint64(3)) & np.uint64(len(bitmap) - 1)]
    return ((byte >> (h & np.uint64(7)).astype(np.uint8)) & 1).astype(bool)


def _bitmap(hashes: np.ndarray) -> np.ndarray:
    """Bit array with >= 64 bits per entry (false-positive rate < 1.6%, so few lookups reach the
    sorted array), at least 1 MiB; 32 MiB for the nine MT-NLG tasks."""
    bits = 1 << max(23, int(np.ceil(np.log2(max(1, len(hashes)) * 64))))
    bm = np.zeros(bits // 8, dtype=np.uint8)
    if len(hashes):
        np.bitwise_or.at(bm, ((hashes >> np.uint64(3)) & np.uint64(len(bm) - 1)).astype(np.int64),
                         (np.uint8(1) << (hashes & np.uint64(7)).astype(np.uint8)))
    return bm
