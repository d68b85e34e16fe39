"""The dedup benchmark's synthetic corpus: Zipf-distributed words, one document in five a planted copy
of another at a known Jaccard similarity. Numpy only, so the GPU MinHash check (python -m
tasks.dedup.gpu) runs on a machine that has none of the pipeline's packages."""
from __future__ import annotations

import numpy as np

LEVELS = [1.0, 0.97, 0.93, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5]
DATASETS, SHARES = ["Wikipedia", "Books", "CC"], [0.2, 0.2, 0.6]


def corpus(n: int, words: int, seed: int) -> tuple[list[dict], list[tuple[int, int]]]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(3, 10))) for _ in range(30_000)], dtype=object)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    n_copies = n // 5
    base = rng.choice(len(vocab), size=(n - n_copies, words), p=p / p.sum())
    texts = [" ".join(vocab[row]) for row in base]
    pairs = []
    shingles = words - 4
    for c in range(n_copies):
        src = int(rng.integers(0, len(base)))
        level = LEVELS[c % len(LEVELS)]
        if level == 1.0:
            text = texts[src].capitalize().replace(" ", ", ", 3) + "."
        else:
            k = max(1, round(shingles * (1 - level) / (5 * (1 + level))))
            row = base[src].copy()
            at = (np.arange(k) * words // k + int(rng.integers(0, max(1, words // k)))) % words
            row[at] = rng.integers(0, len(vocab), size=k)
            text = " ".join(vocab[row])
        pairs.append((src, len(texts)))
        texts.append(text)
    order = rng.permutation(len(texts))  # copies spread over the shards, not all at the end
    where = np.empty(len(texts), dtype=np.int64)
    where[order] = np.arange(len(texts))
    names = rng.choice(len(DATASETS), size=len(texts), p=SHARES)
    docs = [{"id": f"{DATASETS[names[i]]}/{i}", "text": texts[i], "dataset": DATASETS[names[i]], "url": "",
             "crawl": "", "lang": "en", "lang_score": 1.0} for i in order]
    return docs, [(int(where[a]), int(where[b])) for a, b in pairs]
