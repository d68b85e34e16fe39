"""Megatron-LM's indexed dataset format (`.bin` tokens + `.idx` index), written and read here.

`.idx` layout (megatron.core.datasets.indexed_dataset, version 1, little-endian):
    b"MMIDIDX\\x00\\x00"  9-byte magic
    <Q version = 1,  <B dtype code,  <Q sequence count,  <Q document count (entries of the array below)
    int32[sequences]   tokens per sequence
    int64[sequences]   byte offset of each sequence in `.bin`
    int64[documents]   sequence index where each document starts, then the total ([0, 1, ..., n]
                       when every document is one sequence, as GPT pre-training data is)
`.bin` is the sequences' tokens back to back in the dtype: uint16 when the vocabulary has fewer
than 65,500 entries, else int32 (Megatron's `DType.optimal_dtype`).

The writer streams: tokens go straight to `.bin`, only the per-document lengths stay in memory
(4 bytes each), so a shard or a merged dataset of any size is written in bounded memory.
"""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
               np.uint16: 8}
CODE_DTYPES = {code: np.dtype(t) for t, code in DTYPE_CODES.items()}


class IndexFileError(ValueError):
    """An `.idx`/`.bin` pair that is not a valid Megatron indexed dataset."""


def token_dtype(vocab_size: int) -> np.dtype:
    """Megatron's choice: uint16 below 65,500 token ids, int32 otherwise."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def paths(prefix: Path) -> tuple[Path, Path]:
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")


class IndexedWriter:
    """Append documents (1-D token arrays), then `finish()` writes the `.idx`. Use as a context
    manager; the caller commits both files atomically (they are written where `prefix` points)."""

    def __init__(self, prefix: Path, dtype: np.dtype):
        self.bin_path, self.idx_path = paths(prefix)
        self.dtype = np.dtype(dtype)
        self._bin = open(self.bin_path, "wb")
        self._lengths: list[np.ndarray] = []

    def add_documents(self, documents: list[np.ndarray]) -> None:
        if not documents:
            return
        lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise ValueError("a document longer than 2^31 tokens does not fit the .idx format")
        self.add_flat(np.concatenate(documents), lengths)

    def add_flat(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents given as their tokens back to back and each one's length."""
        self._bin.write(np.ascontiguousarray(tokens).astype(self.dtype, copy=False).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int32))

    def add_raw(self, bin_file: Path, lengths: np.ndarray) -> None:
        """Append another dataset's `.bin` bytes as they are (same dtype) with its sequence lengths."""
        with open(bin_file, "rb") as src:
            shutil.copyfileobj(src, self._bin, length=1 << 24)
        self._lengths.append(np.asarray(lengths, dtype=np.int32))

    def finish(self) -> int:
        """Write the `.idx`; returns the number of documents."""
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        write_index(self.idx_path, self.dtype, lengths)
        return int(lengths.size)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finish()
        else:
            self._bin.close()


def write_index(idx_path: Path, dtype: np.dtype, lengths: np.ndarray) -> None:
    pointers = np.zeros(lengths.size, dtype=np.int64)
    if lengths.size > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    documents = np.arange(lengths.size + 1, dtype=np.int64)
    with open(idx_path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", DTYPE_CODES[np.dtype(dtype).type]))
        f.write(struct.pack("<Q", lengths.size))
        f.write(struct.pack("<Q", documents.size))
        f.write(lengths.astype(np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(documents.tobytes())


class IndexedDataset:
    """Memory-mapped reader: `len(ds)` documents, `ds[i]` a token array (a view of the mapping)."""

    def __init__(self, prefix: Path):
        self.bin_path, self.idx_path = paths(prefix)
        raw = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        if raw.size < 34 or bytes(raw[:9]) != MAGIC:
            raise IndexFileError(f"not a Megatron .idx file (bad header): {self.idx_path}")
        version, = struct.unpack("<Q", bytes(raw[9:17]))
        code = int(raw[17])
        if version != VERSION or code not in CODE_DTYPES:
            raise IndexFileError(f"unsupported .idx version {version} or dtype code {code}: {self.idx_path}")
        self.dtype = CODE_DTYPES[code]
        sequences, documents = struct.unpack("<QQ", bytes(raw[18:34]))
        end = 34 + sequences * 4 + sequences * 8 + documents * 8
        if raw.size < end:
            raise IndexFileError(f".idx shorter than its counts say ({raw.size} < {end} bytes): {self.idx_path}")
        self.lengths = np.frombuffer(raw, np.int32, sequences, 34)
        self.pointers = np.frombuffer(raw, np.int64, sequences, 34 + sequences * 4)
        self.document_indices = np.frombuffer(raw, np.int64, documents, 34 + sequences * 12)
        self.tokens = (np.memmap(self.bin_path, dtype=self.dtype, mode="r") if self.bin_path.stat().st_size
                       else np.zeros(0, self.dtype))
        expected = int(self.lengths.astype(np.int64).sum()) * self.dtype.itemsize
        if self.bin_path.stat().st_size != expected:
            raise IndexFileError(f".bin holds {self.bin_path.stat().st_size} bytes but the .idx counts {expected}: "
                                 f"{self.bin_path}")

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.slice(i, 0, int(self.lengths[i]))

    def slice(self, i: int, offset: int, length: int) -> np.ndarray:
        """Tokens [offset, offset + length) of document i."""
        start = int(self.pointers[i]) // self.dtype.itemsize + offset
        return self.tokens[start:start + length]
