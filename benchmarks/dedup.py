"""Dedup benchmark: planted near-duplicates at known Jaccard similarities, signature throughput against
datasketch, the whole stage's docs/s and peak memory on 2 cores (and datatrove's MinHash beside it).

    python -m benchmarks.dedup [--docs 20000] [--words 500] [--repeats 3] [--no-sample] [--no-datatrove]

Documents are `--words` words drawn from a Zipfian vocabulary of 30,000 made-up words, in three
datasets (Wikipedia, Books, CC; priority in that order). A fifth of them are copies of an earlier
document with k words replaced at evenly spaced places, k chosen for a target Jaccard of the word
5-gram sets in {1.0 (case and punctuation changed only), 0.97, 0.93, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6,
0.5}; the true Jaccard of every pair is then computed exactly in pure Python (sets of word tuples).
  recall      planted pairs with true Jaccard >= 0.9 that end in one group (one copy removed in favour
              of the other, or both in favour of the same document) / such pairs
  precision   removed documents whose true Jaccard with the document kept in their place is >= 0.7
              / removed documents (up to 20,000 checked)
  minhash     text -> signature docs/s in one process (num_perm 128, word 5-grams): ours against
              datasketch's MinHash.bulk after Python shingling, with its sha1 and with xxhash's xxh32;
              `_typographic`: the same documents with one curly apostrophe each (the corpus is ASCII, which
              took a faster path than most web pages until 9f6de98: 5.0x then)
  docs_per_s  documents / seconds of the whole stage (its six passes, shards on 2 processes, and its
              validation suite); peak_rss_mb the largest sum of PSS over the process tree while it runs
The sample's own ground truth (its planted exact and near duplicates) is scored the same way.
The last line is `dedup_recall=<r> dedup_precision=<p> minhash_speedup_vs_datasketch=<x>
minhash_speedup_vs_datasketch_xxh=<x> minhash_speedup_typographic=<x> docs_per_s=<n> peak_rss_mb=<m>`.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

from benchmarks import at_least
from benchmarks.dedup_corpus import DATASETS, corpus
from tasks.core.config import parse_params
from tasks.core.runner import adopt_outputs, process_shard, run_stage
from tasks.core.schema import write_docs
from tasks.decontaminate.ngram_index import normalize
from tasks.dedup.minhash import signatures
from tasks.validation import validate_stage

def write_corpus(data: Path, n: int, words: int, seed: int):
    """The corpus as extract's shards (~10k documents each, at least 2); returns the planted pairs'
    ids, the first 10,000 texts (for the signature timing), the document and shard counts."""
    docs, pairs = corpus(n, words, seed)
    (data / "extract/shards").mkdir(parents=True)
    per = max(1, len(docs) // max(2, len(docs) // 20_000 * 2))
    for k in range(0, len(docs), per):
        write_docs(data / f"extract/shards/part-{k // per:05d}.parquet", docs[k:k + per])
    return ([(docs[a]["id"], docs[b]["id"]) for a, b in pairs], [d["text"] for d in docs[:10_000]], len(docs),
            len(docs) // per + (len(docs) % per > 0))


def jaccard(a: str, b: str, n: int = 5) -> float:
    def grams(t):
        w = normalize(t).split()
        return {tuple(w)} if 0 < len(w) < n else {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y) if x | y else 1.0


def outcome(data: Path) -> dict[str, str]:
    """Removed id -> the id kept in its place (from the stage's aside shards)."""
    out = {}
    for f in sorted((data / "dedup/aside/shards").glob("*.parquet")):
        t = pq.read_table(f, columns=["id", "duplicate_of"])
        out.update(zip(t.column("id").to_pylist(), t.column("duplicate_of").to_pylist()))
    return out


def texts_of(data: Path, wanted: set[str]) -> dict[str, str]:
    out = {}
    for f in sorted((data / "extract/shards").glob("*.parquet")):
        t = pq.read_table(f, columns=["id", "text"])
        for i, x in zip(t.column("id").to_pylist(), t.column("text").to_pylist()):
            if i in wanted:
                out[i] = x
    return out


def score(data: Path, pairs: list[tuple[str, str]], removed: dict[str, str], rng) -> tuple[float, float, int]:
    gone = sorted(removed)
    checked = [gone[i] for i in rng.choice(len(gone), size=min(20_000, len(gone)), replace=False)] if gone else []
    text = texts_of(data, {x for pair in pairs for x in pair} | set(checked) | {removed[r] for r in checked})
    keeper = lambda i: removed.get(i, i)  # noqa: E731
    high = [(a, b) for a, b in pairs if jaccard(text[a], text[b]) >= 0.9]
    found = sum(keeper(a) == keeper(b) for a, b in high)
    precise = sum(jaccard(text[r], text[removed[r]]) >= 0.7 for r in checked)
    return found / max(1, len(high)), precise / max(1, len(checked)), len(high)


class PeakRSS:
    """The largest sum of memory over this process and its children, sampled every 100 ms: PSS
    (proportional set size), so pages the processes share are counted once, not once per process."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()

    def __enter__(self):
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_full_info().pss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.1)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def map_processes(pool, stage, pass_name, p, shards, ctx):
    return list(pool.map(partial(process_shard, stage, pass_name, p, ctx=ctx), shards))


def run_ours(data: Path, p) -> tuple[float, int, int]:
    shutil.rmtree(data / "dedup", ignore_errors=True)
    # forkserver: the workers start clean, as a deployment's would, not as copies of this process's corpus
    with PeakRSS() as rss, ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
        t0 = time.perf_counter()
        stats = run_stage("dedup", p, map_shards=partial(map_processes, pool))
        validate_stage("dedup", p)
        seconds = time.perf_counter() - t0
    return seconds, rss.peak, stats["docs_out"]


def run_datatrove(data: Path, work: Path) -> tuple[float, int, int] | None:
    shutil.rmtree(work, ignore_errors=True)
    with PeakRSS() as rss:
        out = subprocess.run([sys.executable, "-m", "benchmarks.datatrove_minhash", str(data / "extract/shards"),
                              str(work)], capture_output=True, text=True)
    if out.returncode:
        print(f"datatrove failed: {out.stderr.strip().splitlines()[-1:]}")
        return None
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["seconds"], rss.peak, res["kept"]


def signature_rates(texts: list[str], small: list[str]) -> tuple[float, float, float]:
    import xxhash
    from datasketch import MinHash

    def python_shingles(t):
        w = normalize(t).split()
        return [" ".join(w[i:i + 5]).encode() for i in range(max(1, len(w) - 4))]

    t0 = time.perf_counter()
    signatures(texts, 128, 1, 5)
    ours = len(texts) / (time.perf_counter() - t0)
    rates = []
    for fn in (None, xxhash.xxh32_intdigest):
        t0 = time.perf_counter()
        MinHash.bulk([python_shingles(t) for t in small], num_perm=128, **({"hashfunc": fn} if fn else {}))
        rates.append(len(small) / (time.perf_counter() - t0))
    return ours, rates[0], rates[1]


def sample_truth(tmp: Path) -> tuple[float, float, int]:
    """The built-in sample's planted exact and near duplicates, through sample -> extract -> dedup."""
    raw = json.loads(json.dumps(_yaml("params.yaml")))
    p = parse_params({**raw, "paths": {"data_dir": str(tmp / "data")}, "dedup": {**raw["dedup"], "input_stage": "extract"}})
    for s in ("sample", "download", "extract", "dedup"):
        run_stage(s, p)
    truth = json.loads((tmp / "data/sample/corpus/ground_truth.json").read_text())["documents"]
    docs = [r for f in sorted((tmp / "data/extract/shards").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    index = {}
    for i, d in enumerate(docs):
        index[d["url"] or d["id"]] = i
    pairs = [(docs[index[t["dup_of"]]]["id"], docs[index[t["key"]]]["id"]) for t in truth
             if t.get("dup_of") and t["key"] in index and t["dup_of"] in index]
    return score(tmp / "data", pairs, outcome(tmp / "data"), np.random.default_rng(0))


def _yaml(path: str) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=at_least(100), default=20_000)
    ap.add_argument("--words", type=at_least(5), default=500)
    ap.add_argument("--repeats", type=at_least(1), default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-sample", action="store_true")
    ap.add_argument("--no-datatrove", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        data = tmp / "data"
        # made in a child process: the corpus is never in this one, whose memory is measured with the stage's
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
            pairs, texts, n_docs, n_shards = pool.submit(write_corpus, data, args.docs, args.words, args.seed).result()
        p = parse_params({"paths": {"data_dir": str(data)}, "dedup": {"input_stage": "extract", "priority": DATASETS[:2]}})
        adopt_outputs(p, "extract")
        print(f"corpus: {n_docs:,} documents of {args.words} words, {len(pairs):,} planted copies, "
              f"{n_shards} shards ({time.perf_counter() - t0:.1f} s)")
        try:
            import datatrove  # noqa: F401
            use_dt = not args.no_datatrove
        except ImportError:
            use_dt = False
            print("datatrove not installed (pip install -e '.[bench]'): not compared")
        signatures(texts[:10], 128, 1, 5)  # compile once
        # the same documents as most English web pages are: with a typographic apostrophe (don’t)
        typographic = [t.replace(" ", "\u2019s ", 1) for t in texts]
        ours, dt, rates, typo_rates = [], [], [], []
        for r in range(args.repeats):  # interleaved: this machine's speed drifts
            rates.append(signature_rates(texts, texts[:1000]))
            typo_rates.append(signature_rates(typographic, typographic[:1000]))
            ours.append(run_ours(data, p))
            if use_dt:
                res = run_datatrove(data, tmp / "datatrove")
                if res:
                    dt.append(res)
            print(f"repeat {r + 1}: minhash docs/s ours {rates[-1][0]:,.0f} datasketch-sha1 {rates[-1][1]:,.0f} "
                  f"datasketch-xxh32 {rates[-1][2]:,.0f}; stage {ours[-1][0]:.1f} s, peak {ours[-1][1] / 2**20:,.0f} MB"
                  + (f"; datatrove {dt[-1][0]:.1f} s, peak {dt[-1][1] / 2**20:,.0f} MB, kept {dt[-1][2]:,}" if dt else ""))
        recall, precision, high = score(data, pairs, outcome(data), np.random.default_rng(0))
        stats = json.loads((data / "dedup/stats.json").read_text())["dedup"]
        print(f"planted pairs with Jaccard >= 0.9: {high:,}; recall {recall:.4f}; precision {precision:.4f}; "
              f"kept {ours[-1][2]:,} (exact removed {stats['exact_removed']:,}, fuzzy {stats['fuzzy_removed']:,}, "
              f"candidate pairs rejected {stats['pairs_rejected']:,})")
        med = lambda xs: statistics.median(xs)  # noqa: E731
        speed = med([r[0] / r[1] for r in rates]), med([r[0] / r[2] for r in rates])
        typo_speed = med([r[0] / r[1] for r in typo_rates])
        print(f"with one typographic apostrophe per document: ours {med([r[0] for r in typo_rates]):,.0f} docs/s, "
              f"{typo_speed:.1f}x datasketch-sha1")
        docs_per_s, peak = n_docs / med([o[0] for o in ours]), med([o[1] for o in ours]) / 2**20
        print(f"minhash text->signature docs/s (median): ours {med([r[0] for r in rates]):,.0f}, datasketch-sha1 "
              f"{med([r[1] for r in rates]):,.0f}, datasketch-xxh32 {med([r[2] for r in rates]):,.0f}")
        print(f"whole stage on 2 cores: {docs_per_s:,.0f} docs/s ({med([o[0] for o in ours]):.1f} s), "
              f"peak memory {peak:,.0f} MB (PSS summed over the processes)")
        if dt:
            print(f"datatrove 4-stage MinHash, 2 workers: {n_docs / med([x[0] for x in dt]):,.0f} docs/s, "
                  f"peak RSS {med([x[1] for x in dt]) / 2**20:,.0f} MB, kept {dt[-1][2]:,}")
        if not args.no_sample:
            s_recall, s_precision, s_high = sample_truth(tmp / "sample")
            print(f"sample ground truth: {s_high} planted pairs with Jaccard >= 0.9, recall {s_recall:.4f}, "
                  f"precision {s_precision:.4f}")
        print(f"dedup_recall={recall:.4f} dedup_precision={precision:.4f} minhash_speedup_vs_datasketch={speed[0]:.1f} "
              f"minhash_speedup_vs_datasketch_xxh={speed[1]:.1f} minhash_speedup_typographic={typo_speed:.1f} "
              f"docs_per_s={docs_per_s:.0f} peak_rss_mb={peak:.0f}")


if __name__ == "__main__":
    main()
