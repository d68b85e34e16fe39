"""MinHash signatures: bit-identical to datasketch (affine32) with the same 32-bit shingle hash, here
recomputed in pure Python from the shingle's bytes, independent of the vectorised numpy path."""
from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import MinHash

from tasks.decontaminate.ngram_index import normalize
from tasks.dedup.minhash import EMPTY, signatures

MASK = (1 << 64) - 1
P, B = 0x100000001B3, 0x9E3779B97F4A7C15


def fmix64(h: int) -> int:
    h ^= h >> 33
    h = h * 0xFF51AFD7ED558CCD & MASK
    h ^= h >> 33
    h = h * 0xC4CEB9FE1A85EC53 & MASK
    return h ^ (h >> 33)


def shingle_hash32(shingle: bytes) -> int:
    """Reference: each word sum((byte + 1) * P**k) then fmix64; the window folds them with B."""
    words = [fmix64(sum((c + 1) * pow(P, k, 1 << 64) for k, c in enumerate(w)) & MASK) for w in shingle.split(b" ")]
    acc = 0
    for h in words:
        acc = (acc * B + h) & MASK
    return fmix64((acc * B + len(words)) & MASK) & 0xFFFFFFFF


def shingles(text: str, n: int) -> list[bytes]:
    w = normalize(text).split()
    if 0 < len(w) < n:
        return [" ".join(w).encode()]
    return [" ".join(w[i:i + n]).encode() for i in range(len(w) - n + 1)]


def documents(rng: random.Random, count: int) -> list[str]:
    vocab = ["the", "Cat", "sat,", "on", "mat.", "naïve", "Über", "日本語", "x", "—", "dog's", "42", "ελληνικά"]
    docs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 60))) for _ in range(count)]
    return docs + ["", "   ", "!!! ...", "one two", "word " * 200]


@pytest.mark.parametrize("num_perm,seed,n", [(128, 1, 5), (64, 7, 3), (16, 123, 1)])
def test_signatures_equal_datasketch(num_perm, seed, n):
    docs = documents(random.Random(seed), 60)
    ours = signatures(docs, num_perm=num_perm, seed=seed, n=n)
    for text, row in zip(docs, ours):
        ref = MinHash(num_perm=num_perm, seed=seed, hashfunc=shingle_hash32)
        ref.update_batch(shingles(text, n))
        assert np.array_equal(row, ref.hashvalues), text


def test_empty_short_and_repeated_documents():
    sig = signatures(["", "!!!", "two words", "two words", "word " * 1000, "word " * 10], num_perm=32)
    assert (sig[0] == EMPTY).all() and (sig[1] == EMPTY).all()      # no words: the empty signature
    assert np.array_equal(sig[2], sig[3]) and not (sig[2] == EMPTY).all()  # short: one whole-text shingle
    assert np.array_equal(sig[4], sig[5])  # one repeated word: the same single shingle, any length


def test_word_hashes_are_decontaminations():
    from tasks.decontaminate import ngram_index
    from tasks.dedup.minhash import word_hashes
    for text in ["", "  ", "a", "the cat\tsat\n\non  the mat ", "naïve Über 日本語 ελληνικά x" * 50, "\x01 a \x01"]:
        assert np.array_equal(word_hashes(text), ngram_index.word_hashes(text)), text


def char_shingle_hash32(shingle: str) -> int:
    """Reference for character shingles: each character fmix64(code point + 1), folded with B."""
    acc = 0
    for c in shingle:
        acc = (acc * B + fmix64(ord(c) + 1)) & MASK
    return fmix64((acc * B + len(shingle)) & MASK) & 0xFFFFFFFF


@pytest.mark.parametrize("n", [5, 3])
def test_char_signatures_equal_datasketch(n):
    docs = documents(random.Random(n), 40)
    ours = signatures(docs, num_perm=64, seed=3, n=n, unit="char")
    for text, row in zip(docs, ours):
        s = " ".join(normalize(text).split())
        grams = [s] if 0 < len(s) < n else [s[i:i + n] for i in range(len(s) - n + 1)]
        ref = MinHash(num_perm=64, seed=3, hashfunc=char_shingle_hash32)
        ref.update_batch(grams)
        assert np.array_equal(row, ref.hashvalues), text


def test_shingle_sets_are_each_documents_sorted_unique_hashes():
    from tasks.dedup.minhash import shingle_hashes, shingle_sets
    docs = ["a b c d e f a b c d e f", "", "x y", "one two three four five six seven"]
    h, off = shingle_hashes(docs, 5)
    s, so = shingle_sets(h, off)
    for d in range(len(docs)):
        assert np.array_equal(s[so[d]:so[d + 1]], np.unique(h[off[d]:off[d + 1]]))


def test_the_compiled_one_pass_path_equals_the_numpy_path():
    """Signatures, exact keys and shingles of the fused kernel equal the vectorised numpy path's,
    on ASCII (punctuation, control bytes, \\x01, tabs) and non-ASCII documents."""
    from tasks.dedup.fused import sign_words
    from tasks.dedup.minhash import shingle_hashes, signatures_of
    from tasks.dedup.signing import exact_keys

    rng = random.Random(9)
    docs = documents(rng, 80) + ["a\x01b c\x00d", "Tab\tsep\x0bvt\x1fus  x", "__init__ self.x = 1;", "ÀB C d e f",
                                 "don't stop-me now, please!", "\x01", "a " * 3]
    for n in (5, 2):
        sig, keys, words, shingles, offs = sign_words(docs, n, 64, 7)
        hashes, offsets = shingle_hashes(docs, n)
        ref_keys, has = exact_keys(docs)
        assert np.array_equal(sig, signatures_of(hashes, offsets, 64, 7))
        assert np.array_equal(keys, ref_keys) and np.array_equal(words > 0, has)
        assert np.array_equal(offs, offsets) and np.array_equal(shingles, hashes)


def test_copies_in_other_unicode_forms_have_one_signature():
    """A copy with decomposed accents or ligatures (PDF-extracted books) had other words, so it was neither an
    exact nor a near duplicate (Jaccard 0.17 against its NFC original on a short biography)."""
    import unicodedata

    from tasks.dedup.fused import sign_words
    text = ("Marie Curie, née Skłodowska, was the ﬁrst woman to win a Nobel Prize and the ﬁrst person to win it "
            "twice; she founded the Curie institutes in Paris and in Warsaw, where her café stood.")
    plain = text.replace("ﬁ", "fi")
    sig, exact, words, _, _ = sign_words([plain, text, unicodedata.normalize("NFD", plain)])
    assert (sig[0] == sig[1]).all() and (sig[0] == sig[2]).all()
    assert exact[0] == exact[1] == exact[2] and words[0] == words[2]


def test_typographic_pages_take_the_ascii_path_with_the_same_words(monkeypatch):
    """Curly quotes, dashes and no-break spaces (most English web pages have one) sent a page down the
    Python path, ~5x slower for the same words; now they are replaced in its bytes first. Each of them is
    checked to be punctuation (or a word break) whichever way normalize reads it: NFKC first or not."""
    import unicodedata

    from tasks.decontaminate import ngram_index as ni
    from tasks.dedup.fused import sign_words
    for c in ni._TYPOGRAPHIC_SPACES:
        assert c.isspace(), hex(ord(c))
    for c in ni._TYPOGRAPHIC_MARKS:  # no combining mark (it joins the letter before it), nothing NFKC makes a letter
        assert all(ni._NOT_WORD.match(x) and not x.isspace() and unicodedata.category(x)[0] != "M"
                   for x in c + unicodedata.normalize("NFKC", c)), hex(ord(c))
    rng = random.Random(5)
    marks = ni._TYPOGRAPHIC_SPACES + ni._TYPOGRAPHIC_MARKS
    others = ["é", "e\u0301", "ﬁ", "Ä", "\u00a8", "\u00b4", "²", "K", "İ", "ß", "x", "_", "-", "'", ".", " ", "\n"]
    texts = []
    for i in range(3000):
        parts = []
        for _ in range(rng.randint(1, 30)):
            kind = rng.random()  # two in three texts typographic only, as English pages; the rest mixed
            parts.append(rng.choice(["Don", "it", "THE", "year", "1999", "co", "op", "x"]) if kind < 0.85 else
                         rng.choice(marks) if kind < 0.95 or i % 3 else rng.choice(others))
            parts.append(rng.choice(["", " ", " ", "  "]))
        texts.append("".join(parts))
    assert sum(ni.without_typography(t) is not None and not t.isascii() for t in texts) > 1000
    fast = [ni.words_of(t) for t in texts]
    assert all(len(ni.token_spans(t)) == len(w) for t, w in zip(texts, fast))  # decontam cuts at these spans
    sig_fast = sign_words(texts, n=3, num_perm=16)
    monkeypatch.setattr(ni, "_TYPOGRAPHIC", {})  # the Python path for every non-ASCII page, as before
    assert [ni.words_of(t) for t in texts] == fast
    slow = sign_words(texts, n=3, num_perm=16)
    for a, b in zip(sig_fast, slow):
        assert np.array_equal(a, b)
