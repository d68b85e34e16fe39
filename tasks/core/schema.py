"""The one document schema every text stage reads and writes, and its Parquet I/O.

Columns:
  id          stable unique id: "<dataset>/<source file>/<record index>"
  text        UTF-8 main text
  dataset     source dataset ("common-crawl" or a curated name such as "Pile-CC", "Wikipedia (en)")
  url         source URL (empty for curated documents without one)
  crawl       Common Crawl id (e.g. CC-MAIN-2020-50); empty for curated documents
  lang        fastText lid.176's label (ISO 639-1, else 639-3), or "unknown" (tasks/extract/langid.py)
  lang_score  language-ID confidence: fastText's probability in [0, 1]; 0 for texts too short to tell
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core import stopping

CRAWL_DATASET = "common-crawl"  # the dataset of every page extract takes from the crawl's WARC files

DOC_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("dataset", pa.string()),
        ("url", pa.string()),
        ("crawl", pa.string()),
        ("lang", pa.string()),
        ("lang_score", pa.float32()),
    ]
)
COLUMNS = DOC_SCHEMA.names


class DocWriter:
    """Streams documents into one Parquet file in bounded row groups."""

    def __init__(self, path: Path, rows_per_group: int = 2000, bytes_per_group: int = 64 << 20):
        self._writer = pq.ParquetWriter(path, DOC_SCHEMA, compression="zstd", write_statistics=False)
        self._rows: dict[str, list] = {c: [] for c in COLUMNS}
        self._n = 0
        self._bytes = 0
        self.rows_per_group = rows_per_group
        self.bytes_per_group = bytes_per_group
        self.docs = 0
        self.text_bytes = 0

    def write(self, doc: dict) -> None:
        stopping.check()  # every stage's document loop passes here: where an interrupted shard stops
        for c in COLUMNS:
            self._rows[c].append(doc[c])
        self._n += 1
        size = len(doc["text"].encode("utf-8"))
        self._bytes += size
        self.docs += 1
        self.text_bytes += size
        if self._n >= self.rows_per_group or self._bytes >= self.bytes_per_group:
            self._flush()

    def write_table(self, table: pa.Table) -> None:
        """Append Arrow rows as they are (no per-row Python), after any buffered rows."""
        self._flush()
        if table.num_rows:
            self._writer.write_table(table.select(COLUMNS).cast(DOC_SCHEMA))
            self.docs += table.num_rows
            self.text_bytes += text_bytes(table)

    def _flush(self) -> None:
        if self._n:
            self._writer.write_table(pa.table(self._rows, schema=DOC_SCHEMA))
            self._rows = {c: [] for c in COLUMNS}
            self._n = self._bytes = 0

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def __enter__(self) -> "DocWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def text_bytes(table) -> int:
    """UTF-8 bytes of the `text` column, without materialising Python strings."""
    return int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0)


def write_docs(path: Path, docs: Iterable[dict]) -> DocWriter:
    with DocWriter(path) as w:
        for d in docs:
            w.write(d)
    return w


def iter_docs(path: Path, columns: list[str] | None = None, batch_size: int = 1000) -> Iterator[dict]:
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
        stopping.check()
        yield from batch.to_pylist()


def iter_batches(path: Path, columns: list[str] | None = None, batch_size: int = 5000):
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
        stopping.check()
        yield batch
