"""Stage `filter` against ground truth, its throughput on one core, and datatrove's filters beside it.

    python -m benchmarks.filter [--docs 20000] [--repeats 5] [--compare-docs 2000]

1. The built-in sample through sample -> download -> extract -> filter: precision and recall of the
   removal against the generator's labels (spam, non-English, boilerplate, repetitive, lorem ipsum and
   keyword-stuffed pages are low quality; prose and its duplicates are not; extraction's special
   records are not labelled).
2. A larger corpus from the same generators, as extract's shards: the stage run on one core
   (sequential runner); docs/s and MB/s of rules + classifier scoring (the rules and score passes).
3. datatrove's GopherRepetition, GopherQuality and C4Quality filters and our rules on the same
   crawl pages (the documents our rules apply to), interleaved repeats; the median of the repeats' ratios
   (when datatrove is installed: the `bench` extra).

Ends with `filter_precision=<p> filter_recall=<r> docs_per_s=<n> speedup_vs_datatrove=<x>`.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tasks.core.config import parse_params
from tasks.core.runner import adopt_outputs, run_stage
from tasks.core.schema import write_docs
from tasks.extract.langid import detect_lang
from tasks.filter.rules import apply_rules
from tasks.sample import text as gen
from tasks.sample.generate import KINDS, LOW_QUALITY
from tasks.validation import validate_stage

CRAWL_KINDS = tuple((k, w) for k, w in KINDS if k not in ("exact_dup", "near_dup", "contaminated"))


def _params(data: Path, **over):
    raw = yaml.safe_load(Path("params.yaml").read_text())
    raw["paths"] = {**raw["paths"], "data_dir": str(data)}
    raw["runner"] = {"kind": "sequential", "max_workers": 1, "dask_address": None}
    raw.update(over)
    return parse_params(raw)


def precision_recall(data: Path, label: dict[str, bool]) -> tuple[float, float, int]:
    """label: id -> should be removed. Removed = in the stage's aside shards."""
    removed = set()
    for f in sorted((data / "filter/aside/shards").glob("*.parquet")):
        removed.update(pq.read_table(f, columns=["id"]).column("id").to_pylist())
    tp = sum(1 for i, bad in label.items() if bad and i in removed)
    fp = sum(1 for i, bad in label.items() if not bad and i in removed)
    fn = sum(1 for i, bad in label.items() if bad and i not in removed)
    return tp / max(tp + fp, 1), tp / max(tp + fn, 1), len(label)


def sample_truth(tmp: Path) -> tuple[float, float, int]:
    p = _params(tmp / "data")
    for s in ("sample", "download", "extract", "filter"):
        run_stage(s, p)
    validate_stage("filter", p)
    truth = {d["key"]: d for d in json.loads((tmp / "data/sample/corpus/ground_truth.json").read_text())["documents"]}
    label = {}
    for f in sorted((tmp / "data/extract/shards").glob("*.parquet")):
        for r in pq.read_table(f, columns=["id", "url", "dataset"]).to_pylist():
            t = truth.get(r["url"]) if r["dataset"] == "common-crawl" else {"kind": "curated"}
            if t and t["kind"] != "special":
                label[r["id"]] = t["kind"] in LOW_QUALITY
    return precision_recall(tmp / "data", label)


def _page(rng: random.Random, kind: str) -> tuple[str, str]:
    topic = rng.choice(sorted(gen.TOPICS))
    if kind == "spam":
        paras = gen.spam_paragraphs(rng, rng.randint(3, 6))
    elif kind == "non_english":
        paras = gen.foreign_paragraphs(rng, rng.choice(["de", "fr", "es"]), rng.randint(3, 6))
    elif kind == "boilerplate":
        paras = gen.boilerplate_paragraphs(rng)
    elif kind == "repetitive":
        paras = gen.repetitive_paragraphs(rng, topic)
    elif kind == "lorem":
        paras = gen.lorem_paragraphs(rng)
    elif kind == "seo":
        paras = gen.seo_paragraphs(rng)
    else:
        paras = gen.paragraphs(rng, topic, rng.randint(3, 7))
    return "\n\n".join(paras), kind


def write_corpus(data: Path, n: int, seed: int) -> tuple[dict[str, bool], list[dict]]:
    """n crawl pages (kinds as the sample's crawl, duplicates aside) plus n/4 curated articles, as
    extract's shards of 5,000 documents, with language ID run as extract runs it."""
    rng = random.Random(seed)
    kinds, weights = zip(*CRAWL_KINDS)
    docs, label = [], {}
    for i in range(n + n // 4):
        curated = i >= n
        text, kind = _page(rng, "normal" if curated else rng.choices(kinds, weights)[0])
        lang, score = detect_lang(text, 5000)
        dataset = "Wikipedia (en)" if curated else "common-crawl"
        d = {"id": f"{dataset}/bench/{i}", "text": text, "dataset": dataset, "url": "" if curated else f"https://b/{i}",
             "crawl": "" if curated else "CC-MAIN-2020-50", "lang": lang, "lang_score": score}
        docs.append(d)
        label[d["id"]] = kind in LOW_QUALITY
    rng.shuffle(docs)
    (data / "extract/shards").mkdir(parents=True)
    for k in range(0, len(docs), 5000):
        write_docs(data / f"extract/shards/part-{k // 5000:05d}.parquet", docs[k:k + 5000])
    return label, docs


def datatrove_rate(docs: list[dict]) -> float:
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter

    filters = [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter()]
    t0 = time.perf_counter()
    for d in docs:
        doc = Document(text=d["text"], id=d["id"])
        for f in filters:
            if f.filter(doc) is not True:
                break
    return len(docs) / (time.perf_counter() - t0)


def ours_rate(table: pa.Table, p) -> float:
    t0 = time.perf_counter()
    for lo in range(0, table.num_rows, p.filter.batch_docs):
        apply_rules(table.slice(lo, p.filter.batch_docs), p.filter)
    return table.num_rows / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compare-docs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-filter-") as tmp:
        tmp = Path(tmp)
        sp, sr, sn = sample_truth(tmp / "sample")
        print(f"sample: {sn} labelled documents, precision {sp:.4f} recall {sr:.4f}")

        data = tmp / "big/data"
        t0 = time.perf_counter()
        label, docs = write_corpus(data, args.docs, args.seed)
        print(f"corpus: {len(docs):,} documents ({time.perf_counter() - t0:.1f} s)")
        p = _params(data)
        adopt_outputs(p, "extract")
        stats = run_stage("filter", p)
        validate_stage("filter", p)
        secs = {x["name"]: x["seconds"] for x in stats["passes"]}
        mb = stats["bytes_in"] / 1e6
        busy = secs["rules"] + secs["score"]
        bp, br, _ = precision_recall(data, label)
        print(f"stage on one core: {stats['docs_in']:,} documents, {mb:.1f} MB; rules {secs['rules']:.1f} s, "
              f"classifier training {secs['classifier']:.1f} s (AUC {stats.get('classifier_auc')}), scoring "
              f"{secs['score']:.1f} s; rules + scoring {stats['docs_in'] / busy:,.0f} docs/s, {mb / busy:.1f} MB/s")
        print(f"corpus: precision {bp:.4f} recall {br:.4f}; dropped {json.dumps(stats['dropped'])}")

        speedup = None
        try:
            import datatrove  # noqa: F401
        except ImportError:
            print("datatrove not installed (pip install -e '.[bench]'): not compared")
        else:
            # the crawl's pages only: our rules pass the curated articles as they are (filter.rules_datasets),
            # while datatrove filters every document (a fifth of them were free for us)
            sub = [d for d in docs if d["dataset"] in p.filter.rules_datasets][:args.compare_docs]
            table = pa.Table.from_pylist(sub)
            ours_rate(table.slice(0, 10), p)  # compiled once
            ours, theirs = [], []
            for _ in range(args.repeats):  # interleaved: this machine's speed drifts
                ours.append(ours_rate(table, p))
                theirs.append(datatrove_rate(sub))
            speedup = statistics.median(o / t for o, t in zip(ours, theirs))
            print(f"rules on {len(sub):,} documents: ours {statistics.median(ours):,.0f} docs/s, datatrove "
                  f"(GopherRepetition + GopherQuality + C4Quality) {statistics.median(theirs):,.0f} docs/s; "
                  f"ratios {[round(o / t, 1) for o, t in zip(ours, theirs)]}")
        print(f"filter_precision={sp:.4f} filter_recall={sr:.4f} docs_per_s={stats['docs_in'] / busy:.0f} "
              f"speedup_vs_datatrove={speedup if speedup is None else round(speedup, 1)}")


if __name__ == "__main__":
    main()
