"""Passes `tokens` (sharded) and `datasets` (global) of stage tokenize.

tokens:   each input shard's documents encoded in batches (one encode_batch call each) into a Parquet
          piece of (dataset, tokens) rows in input order, every document ending in the end-of-document
          token; a document with no token is left out. Bounded memory: one batch at a time, encoded in
          calls of up to tokenizer.ENCODE_CHARS characters. Common Crawl documents are named by snapshot.
datasets: the pieces merged, in shard order, into one Megatron indexed dataset per `dataset` value,
          streaming (all writers open at once, each piece read once).
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core import stopping
from tasks.core.config import PipelineParams
from tasks.core.passes import Shard, ShardStats
from tasks.core.schema import CRAWL_DATASET
from tasks.core.stage import Context, input_files, shard_per_file
from tasks.tokenize import indexed, tokenizer

PIECE_SCHEMA = pa.schema([("dataset", pa.string()), ("tokens", pa.list_(pa.int32()))])
MANIFEST = "datasets.json"


def tokenizer_path(ctx: Context) -> Path:
    return ctx.pass_dir("tokenizer") / "tokenizer.json"


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int):
    return tokenizer.load(Path(path))


def load_tokenizer(ctx: Context):
    path = tokenizer_path(ctx)
    return _tokenizer(str(path), path.stat().st_mtime_ns)


def plan_tokens(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(input_files(ctx))


def blend_names(batch: pa.RecordBatch) -> pa.Array:
    """The dataset a document is blended as: its `dataset`, except that Common Crawl documents are
    split by snapshot as MT-NLG blends them (crawl CC-MAIN-2020-50 -> dataset CC-2020-50)."""
    dataset = batch.column("dataset").cast(pa.string())
    crawl = batch.column("crawl").cast(pa.string())
    snapshot = pc.and_(pc.equal(dataset, CRAWL_DATASET), pc.match_substring_regex(crawl, r"^CC-MAIN-\d{4}-\d{2}$"))
    renamed = pc.binary_join_element_wise("CC-", pc.utf8_slice_codeunits(crawl, 8), "")
    return pc.if_else(snapshot, renamed, dataset)


def tokenize_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    tok, st = load_tokenizer(ctx), ShardStats()
    tokens_total = 0
    with pq.ParquetWriter(tmp, PIECE_SCHEMA, compression="zstd") as writer:
        for batch in pq.ParquetFile(shard.inputs[0]).iter_batches(batch_size=p.tokenize.batch_docs,
                                                                  columns=["text", "dataset", "crawl"]):
            stopping.check()  # an interrupted run stops this shard here
            texts = batch.column("text").to_pylist()
            tokens, lengths, kept = tokenizer.encode_documents(tok, texts)
            offsets = np.zeros(lengths.size + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens, type=pa.int32()))
            names = blend_names(batch).filter(pa.array(kept))
            writer.write_table(pa.table({"dataset": names, "tokens": column}, schema=PIECE_SCHEMA))
            st.docs_in += len(texts)
            st.docs_out += int(lengths.size)
            if lengths.size < len(texts):
                st.drop("no_tokens", len(texts) - int(lengths.size))
            st.bytes_in += int(pc.sum(pc.binary_length(batch.column("text"))).as_py() or 0)
            st.bytes_out += tokens.nbytes
            tokens_total += int(tokens.size)
    st.extra["tokens"] = tokens_total
    return st


def slug(name: str) -> str:
    """A file-name-safe, collision-free prefix for a dataset name ("Wikipedia (en)" -> Wikipedia_en_-1a2b3c4d)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_")[:60] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]


def merge_datasets(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    tok_report = json.loads((ctx.pass_dir("tokenizer") / "tokenizer_report.json").read_text(encoding="utf-8"))
    dtype = indexed.token_dtype(tok_report["vocab_size"])
    writers: dict[str, indexed.IndexedWriter] = {}
    tokens: dict[str, int] = {}
    for piece in sorted((ctx.pass_dir("tokens") / "shards").glob("*.parquet")):
        # batch_docs rows at a time, as the pieces were written: pyarrow's default of 65,536 rows of long documents
        # (a shard of books) held billions of tokens at once, past list<int32>'s 2**31 offsets
        for batch in pq.ParquetFile(piece).iter_batches(batch_size=p.tokenize.batch_docs, columns=["dataset", "tokens"]):
            names, lists = batch.column("dataset"), batch.column("tokens")
            present = pc.unique(names).to_pylist()
            for name in present:
                rows = lists.filter(pc.equal(names, name)) if len(present) > 1 else lists
                offsets = np.asarray(rows.offsets)
                flat = np.asarray(rows.flatten())
                if name not in writers:
                    writers[name] = indexed.IndexedWriter(tmp / slug(name), dtype)
                    tokens[name] = 0
                writers[name].add_flat(flat, np.diff(offsets))
                tokens[name] += int(flat.size)
    datasets = {}
    for name in sorted(writers):
        documents = writers[name].finish()
        datasets[name] = {"prefix": slug(name), "documents": documents, "tokens": tokens[name]}
    manifest = {"vocab_size": tok_report["vocab_size"], "eod_id": tok_report["eod_id"], "dtype": dtype.name,
                "datasets": datasets}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    return {"datasets": {k: {"documents": v["documents"], "tokens": v["tokens"]} for k, v in datasets.items()},
            "dtype": dtype.name}


def read_manifest(datasets_dir: Path) -> dict:
    return json.loads((Path(datasets_dir) / MANIFEST).read_text(encoding="utf-8"))
