"""The task n-gram index as the passes and the validation suite use it: built, loaded (cached per
content digest), and matched against batches of documents."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from tasks.core.config import PipelineParams
from tasks.decontaminate.ngram_index import DOC_SEP, NgramIndex, normalize, word_hashes
from tasks.evalsets.loaders import load_tasks


def build_index(tmp: Path, p: PipelineParams) -> dict:
    d = p.decontaminate
    index = NgramIndex.build(load_tasks(d.tasks, p.paths.benchmarks_dir), d.n, d.min_n)
    index.save(tmp)
    return {"index_entries": int(len(index.hashes)), "index_bytes": index.nbytes(),
            "index_total_bytes": int(sum(index.nbytes().values()))}


@functools.lru_cache(maxsize=2)
def _load_index(folder: str, digest: str) -> NgramIndex:  # digest: reload when the index was rebuilt
    return NgramIndex.load(Path(folder))


def load_index(folder: Path, digest: str) -> NgramIndex:
    return _load_index(str(folder), digest)


def batch_hits(index: NgramIndex, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(document, first word, length, entry) of every match in a batch. The documents are joined
    with a separator word so one vectorised pass covers the batch and no window spans two."""
    h, first_byte = word_hashes(f" {DOC_SEP} ".join(normalize(t) for t in texts), first_bytes=True)
    sep = np.flatnonzero(first_byte == ord(DOC_SEP))  # normalisation removed any \x01 in the texts
    starts, ends = np.concatenate(([0], sep + 1)), np.concatenate((sep, [len(h)]))
    first, length, entry = index.matches(h)
    doc = np.searchsorted(starts, first, side="right") - 1
    inside = first + length <= ends[doc]  # windows touching a separator are not hits
    return doc[inside], (first - starts[doc])[inside], length[inside], entry[inside]


def batch_matches(index: NgramIndex, texts: list[str]) -> list[list[tuple[int, int, int]]]:
    """Per document, its (first word, length, entry) matches."""
    per_doc: list[list[tuple[int, int, int]]] = [[] for _ in texts]
    for d, f, n, e in zip(*(x.tolist() for x in batch_hits(index, texts))):
        per_doc[d].append((f, n, e))
    return per_doc
