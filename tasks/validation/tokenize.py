"""Expectations on `tokenize`, one row per blended dataset, computed by streaming its tokens:
every token id below the vocabulary size, exactly one end-of-document token per document (its last),
the .idx counts consistent with the .bin size, and the realised share of samples within tolerance of
the target (Megatron's greedy blend is never more than about one sample off per dataset)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.tokenize import indexed
from tasks.tokenize.blend import REPORT
from tasks.tokenize.pieces import read_manifest
from tasks.validation.runner import Batch

CHUNK = 1 << 24  # tokens scanned at a time


def expectations() -> list:
    import great_expectations as gx

    zero = ["ids_over_vocab", "docs_not_ending_in_eod", "eod_inside_documents", "bin_bytes_mismatch",
            "share_off_target"]
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
    return {"ids_over_vocab": over, "docs_not_ending_in_eod": len(ds) - last_is_eod,
            "eod_inside_documents": eods - last_is_eod, "bin_bytes_mismatch": abs(ds.bin_path.stat().st_size - expected)}


def batches(p, blend_dir: Path):
    datasets_dir = Path(blend_dir).parent / "datasets"
    manifest = read_manifest(datasets_dir)
    report = json.loads((Path(blend_dir) / REPORT).read_text(encoding="utf-8"))
    tolerance = max(0.005, 2.0 / report["samples"])
    rows = []
    for name, info in sorted(manifest["datasets"].items()):
        row = {"dataset": name, **dataset_row(indexed.IndexedDataset(datasets_dir / info["prefix"]),
                                              manifest["vocab_size"], manifest["eod_id"])}
        blended = report["datasets"].get(name)
        row["share_off_target"] = int(blended is not None and
                                      abs(blended["realised_share"] - blended["target_share"]) > tolerance)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=["dataset", "ids_over_vocab", "docs_not_ending_in_eod", "eod_inside_documents",
                                        "bin_bytes_mismatch", "share_off_target"])
    yield Batch(frame, [("datasets", 0, len(frame))])
