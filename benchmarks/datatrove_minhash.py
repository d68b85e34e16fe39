"""datatrove's 4-stage MinHash dedup (signatures, buckets, clusters, filter) on a folder of Parquet
document shards, as its README runs it with a LocalPipelineExecutor, for `benchmarks.dedup` to time
beside the dedup stage on the same documents and cores.

    python -m benchmarks.datatrove_minhash <shards dir> <work dir> [--workers 2] [--bands 9 --rows 13]

Prints one JSON line: kept documents and seconds. datatrove 0.10.1 hands `str` to xxhash, which
xxhash 4 refuses; its 64-bit xxhash is given the UTF-8 bytes instead (the same hash values)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import xxhash

import datatrove.utils.hashes.xxhash as _xx

_xx.xxhash64 = lambda d: xxhash.xxh64_intdigest(d.encode("utf-8") if isinstance(d, str) else d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("work")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bands", type=int, default=9)
    ap.add_argument("--rows", type=int, default=13)
    args = ap.parse_args()
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import ParquetWriter

    w = Path(args.work)
    shards = len(list(Path(args.shards).glob("*.parquet")))
    cfg = MinhashConfig(n_grams=5, num_buckets=args.bands, hashes_per_bucket=args.rows, seed=1)
    reader = lambda: ParquetReader(args.shards, text_key="text", id_key="id")  # noqa: E731
    start = time.perf_counter()
    for steps, tasks in (([reader(), MinhashDedupSignature(str(w / "sigs"), config=cfg)], shards),
                         ([MinhashDedupBuckets(str(w / "sigs"), str(w / "buckets"), config=cfg)], args.bands),
                         ([MinhashDedupCluster(str(w / "buckets"), str(w / "ids"), config=cfg)], 1),
                         ([reader(), MinhashDedupFilter(str(w / "ids")), ParquetWriter(str(w / "out"))], shards)):
        LocalPipelineExecutor(steps, tasks=tasks, workers=min(args.workers, tasks),
                              logging_dir=str(w / f"logs-{len(list(w.glob('logs-*')))}")).run()
    seconds = time.perf_counter() - start
    kept = sum(pq.read_metadata(f).num_rows for f in (w / "out").rglob("*.parquet"))
    print(json.dumps({"kept": kept, "seconds": round(seconds, 3)}))


if __name__ == "__main__":
    main()
