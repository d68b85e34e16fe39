"""fastText's supervised prediction (top label) for lid.176.ftz, compiled with numba.

Why not fastText's own predict (the fasttext-predict wheel, kept as the oracle in the tests): it
costs about 130 us per 1,000 characters, which made the extract stage 1.7x its bare extraction loop
(`python -m benchmarks.extract`, against 1.05 with the n-gram detector used before). Nearly all of it
is per character n-gram: a std::string, then two lookups in a node-based hash map for the pruned
bucket, then a product-quantized row decoded. Here the rows are decoded once at load (50,000 x 16
floats, 3.2 MB) and a bucket is one read of a 2M-entry uint16 array. Same tokens, same hashes, same
summation order and the same hierarchical-softmax search as fastText 0.9.2, in float32: the tests
hold it to fasttext-predict's label and probability on thousands of real texts.

The model file (fastText's binary format, version 12): args, dictionary (words, then labels, each
with its count; the pruned n-gram buckets), the input matrix product-quantized with quantized
norms, the output matrix dense (one row per inner node of the Huffman tree over label counts).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

_MAGIC, _VERSION = 0x2F4F16BA, 12
_NO_ROW = np.uint16(0xFFFF)
_FNV_START = 2166136261
# read by the compiled code as constants
_EOS = np.frombuffer(b"</s>", np.uint8).copy()  # the end of a line: a word of the vocabulary, and a literal one ends it
_LABEL = np.frombuffer(b"__label__", np.uint8).copy()  # a token starting so is a label: skipped


@dataclass(frozen=True)
class LidModel:
    labels: tuple[str, ...]
    rows: np.ndarray         # float32 [words + kept buckets, dim]: the input matrix, decoded
    bucket_row: np.ndarray   # uint16 [bucket]: row - nwords of an n-gram bucket, or 0xFFFF (pruned)
    nwords: int
    eos_id: int              # "</s>"'s word id, or -1
    vocab_slots: np.ndarray  # int32 [2^k]: word id by open addressing on fastText's hash, or -1
    vocab_bytes: np.ndarray  # uint8: the words' bytes, one after another
    vocab_offsets: np.ndarray  # int64 [nwords + 1]
    output: np.ndarray       # float32 [labels, dim]: row i for inner node labels + i (the last unused)
    left: np.ndarray         # int32 [2 * labels - 1]: the Huffman tree's children (-1 at a leaf)
    right: np.ndarray
    minn: int
    maxn: int
    bucket: int


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def read(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def array(self, dtype, count: int) -> np.ndarray:
        a = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += a.nbytes
        return a

    def cstring(self) -> bytes:
        end = self.data.index(b"\0", self.at)
        s, self.at = self.data[self.at:end], end + 1
        return s


def _huffman(counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """HierarchicalSoftmaxLoss::buildTree: labels come sorted by count, most frequent first."""
    osz = len(counts)
    count = [int(c) for c in counts] + [10**15] * (osz - 1)
    left, right = np.full(2 * osz - 1, -1, np.int32), np.full(2 * osz - 1, -1, np.int32)
    leaf, node = osz - 1, osz
    for i in range(osz, 2 * osz - 1):
        mini = [0, 0]
        for j in range(2):
            if leaf >= 0 and count[leaf] < count[node]:
                mini[j], leaf = leaf, leaf - 1
            else:
                mini[j], node = node, node + 1
        left[i], right[i] = mini
        count[i] = count[mini[0]] + count[mini[1]]
    return left, right


def load(path: str | Path) -> LidModel:
    r = _Reader(Path(path).read_bytes())
    if r.read("ii") != (_MAGIC, _VERSION):
        raise ValueError(f"{path}: not a fastText model of format version {_VERSION}")
    dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr, _t = r.read("12id")
    if (word_ngrams, loss, model) != (1, 1, 3):  # lid.176: unigrams, hierarchical softmax, supervised
        raise ValueError(f"{path}: only a supervised hierarchical-softmax model of word unigrams is supported")
    size, nwords, nlabels = r.read("iii")
    _ntokens, prune_size = r.read("qq")
    if prune_size < 0:  # quantized without -cutoff: bucket b would be row nwords + b, which the uint16 table cannot hold
        raise ValueError(f"{path}: a quantized model whose n-gram buckets were not pruned is not supported")
    if prune_size >= int(_NO_ROW):
        raise ValueError(f"{path}: {prune_size} pruned buckets do not fit the uint16 table")
    words, counts = [], []
    for _ in range(size):
        w = r.cstring()
        c, _kind = r.read("qb")
        words.append(w)
        counts.append(c)
    pruned = r.array(np.int32, 2 * prune_size).reshape(-1, 2) if prune_size > 0 else np.zeros((0, 2), np.int32)
    if not r.read("?"):
        raise ValueError(f"{path}: expected a quantized input matrix (.ftz)")
    qnorm = r.read("?")
    m, n, codesize = r.read("qqi")
    codes = r.array(np.uint8, codesize)
    pdim, nsubq, dsub, lastdsub = r.read("iiii")
    centroids = r.array(np.float32, pdim * 256)
    norms = np.ones(m, np.float32)
    if qnorm:
        norm_codes = r.array(np.uint8, m)
        r.read("iiii")
        norms = r.array(np.float32, 256)[norm_codes]
    if r.read("?"):
        raise ValueError(f"{path}: a quantized output matrix is not supported")
    om, on = r.read("qq")
    output = r.array(np.float32, om * on).reshape(om, on).copy()
    # decode every row once: ProductQuantizer::addcode adds alpha * centroid, so a row is alpha * centroid
    rows = np.empty((m, n), np.float32)
    code = codes.reshape(m, nsubq).astype(np.int64)
    for q in range(nsubq):
        d = lastdsub if q == nsubq - 1 else dsub
        base = q * 256 * dsub
        cent = centroids[base: base + 256 * d].reshape(256, d)
        rows[:, q * dsub: q * dsub + d] = norms[:, None] * cent[code[:, q]]
    bucket_row = np.full(bucket, _NO_ROW, np.uint16)
    bucket_row[pruned[:, 0]] = pruned[:, 1]
    slots = np.full(1 << max(4, (2 * nwords - 1).bit_length()), -1, np.int32)
    for wid, w in enumerate(words[:nwords]):
        s = _fnv_range(np.frombuffer(w, np.uint8), 0, len(w)) & (len(slots) - 1)
        while slots[s] != -1:
            s = (s + 1) & (len(slots) - 1)
        slots[s] = wid
    offsets = np.zeros(nwords + 1, np.int64)
    offsets[1:] = np.cumsum([len(w) for w in words[:nwords]])
    left, right = _huffman(counts[nwords:])
    eos_id = words.index(_EOS.tobytes()) if _EOS.tobytes() in words[:nwords] else -1
    return LidModel(tuple(w.decode().removeprefix("__label__") for w in words[nwords:]), rows, bucket_row, nwords,
                    eos_id, slots, np.frombuffer(b"".join(words[:nwords]), np.uint8).copy(), offsets, output, left, right,
                    minn, maxn, bucket)


@numba.njit(cache=True, nogil=True, inline="always")
def _fnv_step(h, byte):
    """One byte of Dictionary::hash, 32-bit FNV-1a, where fastText xors the byte as a signed char."""
    b = np.int64(byte)
    if b & 0x80:
        b |= 0xFFFFFF00
    return ((h ^ b) * 16777619) & 0xFFFFFFFF


@numba.njit(cache=True, nogil=True)
def _fnv_range(text, start, end):
    h = np.int64(_FNV_START)
    for i in range(start, end):
        h = _fnv_step(h, text[i])
    return h


@numba.njit(cache=True, nogil=True, inline="always")
def _starts_with(text, start, end, prefix):
    if end - start < len(prefix):
        return False
    for i in range(len(prefix)):
        if text[start + i] != prefix[i]:
            return False
    return True


@numba.njit(cache=True, nogil=True, inline="always")
def _std_log(x):
    """Loss::std_log: a float in, log(x + 1e-5) in double, a float out."""
    return np.float32(np.log(np.float64(x) + 1e-5))


@numba.njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    """Dictionary::readWord's separators: ' ' \\n \\r \\t \\v \\f \\0 (a newline reads as a space here)."""
    return c == 32 or c == 10 or c == 13 or c == 9 or c == 11 or c == 12 or c == 0


@numba.njit(cache=True, nogil=True)
def _word_id(text, start, end, h, slots, vocab_bytes, offsets):
    mask = np.int64(len(slots) - 1)
    s = h & mask
    while slots[s] != -1:
        wid = slots[s]
        a, b = offsets[wid], offsets[wid + 1]
        if b - a == end - start:
            same = True
            for i in range(end - start):
                if vocab_bytes[a + i] != text[start + i]:
                    same = False
                    break
            if same:
                return wid
        s = (s + 1) & mask
    return -1


@numba.njit(cache=True, nogil=True)
def _add_row(hidden, rows, r):
    for d in range(hidden.shape[0]):
        hidden[d] += rows[r, d]


@numba.njit(cache=True, nogil=True)
def _add_ngrams(word, hidden, rows, bucket_row, nwords, minn, maxn, bucket):
    """Dictionary::computeSubwords on '<' + token + '>' (n counts characters, not bytes); returns rows
    added. The n-grams from one start share their prefix, so FNV-1a runs on from the shorter one."""
    added = 0
    size = len(word)
    for i in range(size):
        if (word[i] & 0xC0) == 0x80:
            continue
        h = np.int64(_FNV_START)
        j = i
        n = 1
        while j < size and n <= maxn:
            while True:  # one character: its lead byte, then its continuation bytes
                h = _fnv_step(h, word[j])
                j += 1
                if j >= size or (word[j] & 0xC0) != 0x80:
                    break
            if n >= minn and not (n == 1 and (i == 0 or j == size)):
                r = bucket_row[h % bucket]
                if r != 0xFFFF:
                    _add_row(hidden, rows, nwords + np.int64(r))
                    added += 1
            n += 1
    return added


@numba.njit(cache=True, nogil=True)
def _predict(text, rows, bucket_row, nwords, eos_id, slots, vocab_bytes, offsets, output, left, right, minn, maxn,
             bucket):
    """(label index, probability) for one line of UTF-8 (no newline), as FastText::predictLine with k=1."""
    dim = rows.shape[1]
    hidden = np.zeros(dim, np.float32)
    count = 0
    word = np.empty(len(text) + 2, np.uint8)
    pos, size = 0, len(text)
    while True:  # Dictionary::getLine: word by word
        while pos < size and _is_space(text[pos]):
            pos += 1
        if pos >= size:
            break
        start = pos
        while pos < size and not _is_space(text[pos]):
            pos += 1
        if pos - start == len(_EOS) and _starts_with(text, start, pos, _EOS):
            break  # a literal "</s>" ends the line for fastText: the rest is not read
        wid = _word_id(text, start, pos, _fnv_range(text, start, pos), slots, vocab_bytes, offsets)
        if wid < 0 and _starts_with(text, start, pos, _LABEL):
            continue
        if wid >= 0:
            _add_row(hidden, rows, wid)
            count += 1
        n = pos - start
        word[0] = 60  # '<'
        word[1: n + 1] = text[start:pos]
        word[n + 1] = 62  # '>'
        count += _add_ngrams(word[: n + 2], hidden, rows, bucket_row, nwords, minn, maxn, bucket)
    if eos_id >= 0:  # the line's end, or a "</s>" in it: the word's row alone, never its n-grams
        _add_row(hidden, rows, eos_id)
        count += 1
    if count == 0:
        return -1, np.float32(0.0)
    hidden *= np.float32(1.0 / count)
    # HierarchicalSoftmaxLoss::dfs with k=1 and threshold 0, left child first; a branch is cut when its
    # log-probability falls under log(1e-5) or under the best leaf found so far
    osz = (len(left) + 1) // 2
    floor = _std_log(0.0)
    best, best_node = np.float32(-np.inf), -1
    stack_node = np.empty(2 * osz, np.int64)
    stack_score = np.empty(2 * osz, np.float32)
    stack_node[0], stack_score[0] = 2 * osz - 2, np.float32(0.0)  # the root
    top = 1
    while top > 0:
        top -= 1
        node, score = stack_node[top], stack_score[top]
        if score < floor or (best_node >= 0 and score < best):
            continue
        if left[node] == -1 and right[node] == -1:
            best, best_node = score, node
            continue
        f = np.float32(0.0)
        for j in range(dim):
            f += output[node - osz, j] * hidden[j]
        f = np.float32(1.0 / np.float64(np.float32(1.0) + np.exp(-f)))
        stack_node[top], stack_score[top] = right[node], score + _std_log(f)
        stack_node[top + 1] = left[node]
        stack_score[top + 1] = score + _std_log(np.float32(1.0 - np.float64(f)))
        top += 2
    return best_node, np.exp(best)


def predict(model: LidModel, text: str) -> tuple[str, float]:
    """(label, probability) of the top label; a newline reads as a space, invalid UTF-8 as '?'."""
    data = np.frombuffer(text.encode("utf-8", "replace"), np.uint8)
    node, prob = _predict(data, model.rows, model.bucket_row, model.nwords, model.eos_id, model.vocab_slots,
                          model.vocab_bytes, model.vocab_offsets, model.output, model.left, model.right, model.minn, model.maxn,
                          model.bucket)
    return (model.labels[node], float(prob)) if node >= 0 else ("unknown", 0.0)  # no word: only without "</s>"
