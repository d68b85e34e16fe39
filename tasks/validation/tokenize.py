"""Expectations on `tokenize`, one row per blended dataset, computed by streaming its tokens:
every token id below the vocabulary size, exactly one end-of-document token per document (its last),
the .idx counts consistent with the .bin size; the realised share of samples, counted in the blend
index itself, within tolerance of the weight params.yaml gives (Megatron's greedy blend is never more
than about one sample off per dataset), every weighted dataset in the blend; and every index in bounds
(blend -> a dataset's shuffle -> sample -> document index -> its documents), so no sample the trainer
reads points past what was built."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.tokenize import indexed
from tasks.tokenize.blend import REPORT, resolve_weights
from tasks.tokenize.pieces import read_manifest
from tasks.validation.runner import Batch

CHUNK = 1 << 24  # tokens scanned at a time


def expectations() -> list:
    import great_expectations as gx

    zero = ["ids_over_vocab", "docs_not_ending_in_eod", "eod_inside_documents", "bin_bytes_mismatch",
            "document_index_mismatch", "unreadable_idx", "share_off_target", "index_out_of_bounds"]
    return [gx.expectations.ExpectColumnValuesToNotBeNull(column="dataset"),
            gx.expectations.ExpectColumnValuesToBeUnique(column="dataset")] + [
        gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0) for c in zero]


def dataset_row(ds: indexed.IndexedDataset, vocab: int, eod: int) -> dict:
    over = eods = 0
    for start in range(0, ds.tokens.size, CHUNK):
        chunk = np.asarray(ds.tokens[start:start + CHUNK])
        wide = chunk.astype(np.int64)
        over += int(((wide >= vocab) | (wide < 0)).sum())
        eods += int((chunk == eod).sum())
    ends = (ds.pointers // ds.dtype.itemsize + ds.lengths - 1)[ds.lengths > 0]
    last_is_eod = int((np.asarray(ds.tokens[ends]) == eod).sum()) if ends.size else 0
    expected = int(ds.lengths.astype(np.int64).sum()) * ds.dtype.itemsize
    # one sequence per document, as tokenize writes them: megatron-core refuses any other document index
    # (sequence_lengths.shape[0] == document_indices[-1]), and a halved one passed here
    docs_ok = np.array_equal(ds.document_indices, np.arange(len(ds) + 1))
    return {"ids_over_vocab": over, "docs_not_ending_in_eod": len(ds) - last_is_eod,
            "eod_inside_documents": eods - last_is_eod, "bin_bytes_mismatch": abs(ds.bin_path.stat().st_size - expected),
            "document_index_mismatch": int(not docs_ok), "unreadable_idx": 0}


def _dataset_row(prefix: Path, vocab: int, eod: int) -> dict:
    """dataset_row, or a row failing unreadable_idx when the .bin/.idx pair cannot be read (a size or dtype
    mismatch, a cut file): the suite crashed on it with exit 1 instead of failing an expectation."""
    try:
        return dataset_row(indexed.IndexedDataset(prefix), vocab, eod)
    except (indexed.IndexFileError, OSError, ValueError, IndexError):
        return {"ids_over_vocab": 0, "docs_not_ending_in_eod": 0, "eod_inside_documents": 0, "bin_bytes_mismatch": 0,
                "document_index_mismatch": 0, "unreadable_idx": 1}


def blend_rows(p, blend_dir: Path, manifest: dict, report: dict) -> dict[str, dict]:
    """Per weighted dataset: its share of the blend index against params.yaml's weight, and how many of
    its indices point past what they index (the blend's own faults counted on every dataset's row)."""
    names, weights, _ = resolve_weights(p, manifest["datasets"])
    samples = int(report["samples"])
    tolerance = max(0.005, 2.0 / samples)
    which = np.asarray(np.load(blend_dir / "dataset_index.npy"), dtype=np.int64)
    nth = np.asarray(np.load(blend_dir / "dataset_sample_index.npy"), dtype=np.int64)
    valid = which >= 0
    counts = np.bincount(which[valid], minlength=len(names))
    stray = int((~valid).sum()) + int(counts[len(names):].sum()) + int(len(which) != samples) \
        + int(len(nth) != samples) + int(report.get("order") != names)
    # each dataset's lowest and highest sample number, in one pass over the blend
    ours = valid & (which < len(names)) if len(which) == len(nth) else np.zeros(0, dtype=bool)
    low, high = np.zeros(len(names), dtype=np.int64), np.full(len(names), -1, dtype=np.int64)
    if ours.any():
        np.minimum.at(low, which[ours], nth[ours])
        np.maximum.at(high, which[ours], nth[ours])
    out = {}
    for i, name in enumerate(names):
        info = manifest["datasets"][name]
        folder = blend_dir / info["prefix"]
        try:
            doc, sample, shuffle = (np.load(folder / f"{k}.npy", mmap_mode="r")
                                    for k in ("document_index", "sample_index", "shuffle_index"))
        except (OSError, ValueError):
            out[name] = {"share_off_target": 1, "index_out_of_bounds": 1}
            continue
        bad = int(high[i] >= len(shuffle)) + int(low[i] < 0) \
            + int((np.asarray(shuffle) >= len(sample) - 1).sum()) + int((np.asarray(sample[:, 0]) >= len(doc)).sum()) \
            + int((np.asarray(doc) >= info["documents"]).sum())
        out[name] = {"share_off_target": int(abs(counts[i] / samples - weights[i]) > tolerance),
                     "index_out_of_bounds": bad + stray}
    return out


def batches(p, blend_dir: Path):
    blend_dir = Path(blend_dir)
    datasets_dir = blend_dir.parent / "datasets"
    manifest = read_manifest(datasets_dir)
    report = json.loads((blend_dir / REPORT).read_text(encoding="utf-8"))
    blended = blend_rows(p, blend_dir, manifest, report)
    rows = []
    for name, info in sorted(manifest["datasets"].items()):
        row = {"dataset": name, **_dataset_row(datasets_dir / info["prefix"], manifest["vocab_size"], manifest["eod_id"])}
        rows.append({**row, **blended.get(name, {"share_off_target": 0, "index_out_of_bounds": 0})})
    frame = pd.DataFrame(rows, columns=["dataset", "ids_over_vocab", "docs_not_ending_in_eod", "eod_inside_documents",
                                        "bin_bytes_mismatch", "document_index_mismatch", "unreadable_idx",
                                        "share_off_target", "index_out_of_bounds"])
    # a "shard" per dataset: a failure names the dataset (it said "in shard datasets")
    yield Batch(frame, [(f"dataset {row['dataset']}", i, i + 1) for i, row in enumerate(rows)] or [("datasets", 0, 0)])
