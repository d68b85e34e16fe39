"""The built-in sample: deterministic, in Common Crawl layout, with ground truth for later stages."""
from __future__ import annotations

import gzip
import json

from tasks.core.config import SampleParams
from tasks.sample.generate import generate


def test_sample_is_deterministic_and_complete(tmp_path, benchmarks_dir):
    p = SampleParams(n_warc_files=2, pages_per_warc=40, curated_docs_per_dataset=20)
    generate(p, tmp_path / "a", str(benchmarks_dir))
    generate(p, tmp_path / "b", str(benchmarks_dir))
    files = sorted(f.relative_to(tmp_path / "a") for f in (tmp_path / "a").rglob("*") if f.is_file())
    assert files and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    listing = gzip.decompress((tmp_path / "a/crawl-data/CC-MAIN-2020-50/warc.paths.gz").read_bytes()).decode()
    assert len(listing.split()) == 2 and all((tmp_path / "a" / x).is_file() for x in listing.split())
    truth = json.loads((tmp_path / "a/ground_truth.json").read_text())
    kinds = {d["kind"] for d in truth["documents"]}
    assert {"normal", "exact_dup", "near_dup", "spam", "non_english", "contaminated", "special"} <= kinds
    datasets = {d["dataset"] for d in truth["documents"] if d["kind"] != "special"}
    assert {"common-crawl", "Wikipedia (en)", "StackExchange"} <= datasets
    dups = [d for d in truth["documents"] if d["kind"] in ("exact_dup", "near_dup")]
    assert any(d["dataset"] != "common-crawl" or not d["dup_of"].startswith("http") for d in dups)  # cross-dataset
    planted = [d for d in truth["documents"] if d["kind"] == "contaminated"]
    assert all(d["passage"] in d["text"] and len(d["passage"].split()) >= 13 for d in planted)


def test_seed_changes_the_sample(tmp_path, benchmarks_dir):
    generate(SampleParams(n_warc_files=1, pages_per_warc=10, seed=1), tmp_path / "a", str(benchmarks_dir))
    generate(SampleParams(n_warc_files=1, pages_per_warc=10, seed=2), tmp_path / "b", str(benchmarks_dir))
    a = (tmp_path / "a/ground_truth.json").read_bytes()
    assert a != (tmp_path / "b/ground_truth.json").read_bytes()
