"""The built-in sample: a deterministic mini-crawl in Common Crawl layout plus curated sets.

    <out>/crawl-data/<crawl>/warc.paths.gz
    <out>/crawl-data/<crawl>/segments/<seg>/warc/<crawl-file>.warc.gz
    <out>/curated/wikipedia_en.jsonl.zst, <out>/curated/stackexchange.jsonl   (Pile-style)
    <out>/ground_truth.json

The pages exercise every later stage: boilerplate around main text, exact and near duplicates
(within and across datasets), keyword spam, non-English pages, pages embedding passages from the
evaluation tasks, and records extraction must skip (non-HTML, 404, revisit, empty, bad encodings).
ground_truth.json records which page is what, so later stages can measure precision and recall.
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import zstandard

from tasks.core.config import SampleParams
from tasks.evalsets.loaders import TASK_NAMES, load_task
from tasks.sample.html import page_html
from tasks.sample.text import (TOPICS, boilerplate_paragraphs, foreign_paragraphs, lorem_paragraphs, paragraphs, perturb,
                               repetitive_paragraphs, seo_paragraphs, spam_paragraphs)
from tasks.sample.warc_writer import WarcBuilder, http_response

KINDS = (("normal", 0.40), ("exact_dup", 0.06), ("near_dup", 0.08), ("spam", 0.07), ("non_english", 0.07),
         ("contaminated", 0.11), ("boilerplate", 0.06), ("repetitive", 0.05), ("lorem", 0.03), ("seo", 0.07))
# what the filter stage should remove (the rest is prose worth training on, duplicates included)
LOW_QUALITY = ("spam", "non_english", "boilerplate", "repetitive", "lorem", "seo")
CURATED = (("Wikipedia (en)", "wikipedia_en.jsonl.zst"), ("StackExchange", "stackexchange.jsonl"))
SEGMENT = "1606141163411.0"


def _passages(root: str, rng: random.Random) -> dict[str, list[str]]:
    """Evaluation texts of at least 13 words per task (short ones are not clear contamination)."""
    out = {}
    for name in TASK_NAMES:
        texts = [" ".join(t.split()) for t in load_task(name, root).decontam_texts()]
        texts = [t for t in texts if len(t.split()) >= 13]
        if texts:
            out[name] = rng.sample(texts, min(50, len(texts)))
    return out


class _Corpus:
    """Remembers clean originals so later pages can duplicate them (within or across datasets)."""

    def __init__(self):
        self.originals: list[tuple[str, str]] = []  # (doc key, main text)


def _curated(rng: random.Random, p: SampleParams, corpus: _Corpus, truth: list) -> dict[str, bytes]:
    files = {}
    for dataset, fname in CURATED:
        lines = []
        for i in range(p.curated_docs_per_dataset):
            key = f"{dataset}/{fname}/{i}"
            kind, dup_of = "normal", None
            if corpus.originals and rng.random() < 0.15:
                dup_of, src = rng.choice(corpus.originals)
                kind = "near_dup" if rng.random() < 0.5 else "exact_dup"
                text = perturb(rng, src, 0.03) if kind == "near_dup" else src
            else:
                text = "\n\n".join(paragraphs(rng, rng.choice(sorted(TOPICS)), rng.randint(3, 7)))
                corpus.originals.append((key, text))
            lines.append(json.dumps({"text": text, "meta": {"pile_set_name": dataset}}, sort_keys=True))
            truth.append({"key": key, "dataset": dataset, "kind": kind, "dup_of": dup_of, "lang": "en"})
        data = ("\n".join(lines) + "\n").encode()
        files[fname] = zstandard.ZstdCompressor(level=3).compress(data) if fname.endswith(".zst") else data
    return files


def _page(rng: random.Random, url: str, corpus: _Corpus, passages: dict[str, list[str]]) -> tuple[list[str], dict]:
    r, acc = rng.random(), 0.0
    kind = KINDS[-1][0]
    for k, w in KINDS:
        acc += w
        if r < acc:
            kind = k
            break
    info = {"key": url, "dataset": "common-crawl", "kind": kind, "dup_of": None, "lang": "en"}
    topic = rng.choice(sorted(TOPICS))
    if kind in ("exact_dup", "near_dup") and corpus.originals:
        info["dup_of"], src = rng.choice(corpus.originals)
        text = src if kind == "exact_dup" else perturb(rng, src, 0.03)
        return text.split("\n\n"), info
    if kind == "spam":
        return spam_paragraphs(rng, rng.randint(3, 6)), info
    if kind == "boilerplate":
        return boilerplate_paragraphs(rng), info
    if kind == "repetitive":
        return repetitive_paragraphs(rng, topic), info
    if kind == "lorem":
        return lorem_paragraphs(rng), info
    if kind == "seo":
        return seo_paragraphs(rng), info
    if kind == "non_english":
        info["lang"] = rng.choice(["de", "fr", "es"])
        return foreign_paragraphs(rng, info["lang"], rng.randint(3, 6)), info
    paras = paragraphs(rng, topic, rng.randint(3, 7))
    if kind == "contaminated" and passages:
        task = rng.choice(sorted(passages))
        passage = rng.choice(passages[task])
        paras.insert(rng.randint(1, len(paras)), passage)
        info.update(task=task, passage=passage)
    else:
        info["kind"] = "normal"
    corpus.originals.append((url, "\n\n".join(paras)))
    return paras, info


def _special_records(w: WarcBuilder, host: str) -> list[dict]:
    """Records extraction must skip or repair, one of each per WARC file."""
    latin = "Caf\u00e9 cr\u00e8me and na\u00efve r\u00e9sum\u00e9 stories from the old harbour town. " * 6
    w.page(f"https://{host}/brochure.pdf", http_response(b"%PDF-1.4 binary", "application/pdf"))
    w.page(f"https://{host}/missing", http_response(b"<html>gone</html>", status="404 Not Found"))
    w.page(f"https://{host}/empty", http_response(b""))
    w.page(f"https://{host}/latin1", http_response(
        f"<html><body><main><p>{latin}</p></main></body></html>".encode("latin-1"), "text/html; charset=iso-8859-1"))
    w.page(f"https://{host}/mislabelled", http_response(
        f"<html><body><main><p>{latin}</p></main></body></html>".encode("cp1252"), "text/html; charset=utf-8"))
    w.add("revisit", f"https://{host}/news", b"HTTP/1.1 304 Not Modified\r\n\r\n", "application/http; msgtype=response",
          extra={"WARC-Profile": "http://netpreserve.org/warc/1.0/revisit/identical-payload-digest"})
    return [{"key": f"https://{host}/{k}", "kind": "special", "special": k}
            for k in ("brochure.pdf", "missing", "empty", "latin1", "mislabelled", "news")]


def generate(p: SampleParams, out: Path, benchmarks_dir: str) -> dict:
    """Write the sample tree into the (new or empty) folder `out`; return its summary."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(p.seed)
    passages = _passages(benchmarks_dir, random.Random(p.seed + 1))
    corpus, truth = _Corpus(), []
    curated = _curated(rng, p, corpus, truth)

    crawl_dir = out / "crawl-data" / p.crawl_id
    warc_paths = []
    for f in range(p.n_warc_files):
        name = f"{p.crawl_id}-{SEGMENT.split('.')[0]}-{f:05d}.warc.gz"
        rel = f"crawl-data/{p.crawl_id}/segments/{SEGMENT}/warc/{name}"
        w = WarcBuilder(random.Random(f"{p.seed}-warc-{f}"))
        w.warcinfo(name, p.crawl_id)
        for i in range(p.pages_per_warc):
            host = f"site{rng.randint(1, 400)}.example.com"
            url = f"https://{host}/{f}/{i}/{rng.getrandbits(24):06x}.html"
            paras, info = _page(rng, url, corpus, passages)
            title = " ".join(paras[0].split()[:6]).strip(".,!")
            lang = info["lang"]
            w.page(url, http_response(page_html(rng, title, paras, lang).encode("utf-8")))
            truth.append({**info, "warc": name, "text": "\n\n".join(paras)})
        truth.extend({**s, "warc": name} for s in _special_records(w, f"special{f}.example.org"))
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(w.getvalue())
        warc_paths.append(rel)
    (crawl_dir / "warc.paths.gz").write_bytes(gzip.compress(("\n".join(warc_paths) + "\n").encode(), mtime=0))
    (out / "curated").mkdir()
    for fname, data in curated.items():
        (out / "curated" / fname).write_bytes(data)
    counts: dict[str, int] = {}
    for t in truth:
        counts[t["kind"]] = counts.get(t["kind"], 0) + 1
    summary = {"crawl_id": p.crawl_id, "warc_files": len(warc_paths), "documents": len(truth),
               "kinds": dict(sorted(counts.items())), "tasks_planted": sorted(passages)}
    (out / "ground_truth.json").write_text(json.dumps({"summary": summary, "documents": truth}, indent=1))
    return summary


def curated_files(sample_dir: Path) -> list[Path]:
    return [sample_dir / "curated" / fname for _, fname in CURATED]
