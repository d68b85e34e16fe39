"""Expectations on `download`: every file is complete, safely named and non-empty."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from tasks.download.http_fetch import gzip_complete
from tasks.validation.runner import Batch


def expectations() -> list:
    import great_expectations as gx

    E = gx.expectations
    return [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectColumnValuesToBeUnique(column="file"),
        E.ExpectColumnValuesToMatchRegex(column="file", regex=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"),
        E.ExpectColumnValuesToBeBetween(column="bytes", min_value=1),
        E.ExpectColumnValuesToBeInSet(column="complete", value_set=[True]),
    ]


def _complete(path: Path) -> bool:
    if path.suffix == ".parquet":
        try:
            pq.read_metadata(path)  # raises on a missing or corrupt footer
            return True
        except Exception:
            return False
    return gzip_complete(path) if path.name.endswith(".gz") else True


def batches(p, shards_dir: Path):
    """One manifest batch: a row per downloaded file (the files themselves are WARC bytes)."""
    rows = [{"file": f.name, "bytes": f.stat().st_size, "complete": _complete(f)}
            for f in sorted(shards_dir.iterdir()) if not f.name.startswith(".tmp-")]
    yield Batch(pd.DataFrame(rows, columns=["file", "bytes", "complete"]), [("manifest", 0, len(rows))])
