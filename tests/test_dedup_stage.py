"""Stage dedup end to end on hand-made extract shards: exact first, fuzzy by MinHash LSH + verification,
MT-NLG's dataset priority for the document each group keeps, the removed documents kept aside, the
report's matrix, resumability, and the bad inputs the issue names."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.core.config import parse_params
from tasks.core.passes import load_stored
from tasks.core.runner import adopt_outputs, run_stage
from tasks.core.schema import write_docs
from tasks.validation import ExpectationFailed, validate_stage

WORDS = [f"w{i}" for i in range(5000)]


def doc(i, text: str, dataset: str) -> dict:
    return {"id": f"{dataset}/{i}", "text": text, "dataset": dataset, "url": "", "crawl": "", "lang": "en",
            "lang_score": 0.9}


def prose(rng: random.Random, n: int = 300) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def edit(rng: random.Random, text: str, k: int) -> str:
    """k words replaced, at positions k apart: about 5k of the 5-gram shingles change."""
    w = text.split()
    for j in range(k):
        w[(j * len(w)) // k] = "x" + rng.choice(WORDS)
    return " ".join(w)


def run(tmp_path: Path, shards: list[list[dict]], **dedup) -> tuple[dict, dict, dict]:
    data = tmp_path / "data"
    (data / "extract/shards").mkdir(parents=True, exist_ok=True)
    for k, docs in enumerate(shards):
        if not (data / f"extract/shards/s{k}.parquet").exists():  # a rerun leaves the input untouched
            write_docs(data / f"extract/shards/s{k}.parquet", docs)
    p = parse_params({"paths": {"data_dir": str(data)}, "dedup": {"input_stage": "extract", "priority": ["Wiki", "Books"], **dedup}})
    adopt_outputs(p, "extract")
    stats = run_stage("dedup", p)
    assert validate_stage("dedup", p).success
    for f in (data / "dedup/signatures/shards").glob("*.npz"):  # a band's columns are contiguous on disk
        assert load_stored(f, "sig").flags.f_contiguous
    kept = {r["id"]: r for f in sorted((data / "dedup/shards").glob("*.parquet")) for r in pq.read_table(f).to_pylist()}
    aside = {r["id"]: r for f in sorted((data / "dedup/aside/shards").glob("*.parquet"))
             for r in pq.read_table(f).to_pylist()}
    return stats, kept, aside


def test_priority_exact_first_aside_and_matrix(tmp_path):
    rng = random.Random(1)
    base, other, third = prose(rng), prose(rng), prose(rng)
    cc = [doc(0, base, "CC"), doc(1, edit(rng, other, 2), "CC"), doc(2, prose(rng), "CC"), doc(3, third, "Misc")]
    wiki = [doc(0, base.upper() + " !!", "Wiki"), doc(1, prose(rng), "Wiki")]  # an exact copy once normalised
    books = [doc(0, other, "Books"), doc(1, edit(rng, third, 1), "Books")]
    stats, kept, aside = run(tmp_path, [cc, wiki, books])
    assert set(aside) == {"CC/0", "CC/1", "Misc/3"}
    assert aside["CC/0"]["reason"] == "exact" and aside["CC/0"]["duplicate_of"] == "Wiki/0"
    assert aside["CC/1"]["reason"] == "fuzzy" and aside["CC/1"]["duplicate_of"] == "Books/0"
    # a dataset not in the priority list ranks after every listed one
    assert aside["Misc/3"]["duplicate_of"] == "Books/1" and aside["Misc/3"]["duplicate_of_dataset"] == "Books"
    assert aside["CC/0"]["text"] == base  # kept aside whole
    d = stats["dedup"]
    assert (d["exact_removed"], d["fuzzy_removed"], stats["docs_out"]) == (1, 2, 5)
    assert d["removed_in_favour_of"] == {"CC": {"Wiki": 1, "Books": 1}, "Misc": {"Books": 1}}
    assert d["datasets"]["CC"] == {"docs": 3, "exact_removed": 1, "fuzzy_removed": 1}
    assert stats["dropped"] == {"exact_duplicate": 1, "fuzzy_duplicate": 2}
    assert "warnings" not in stats
    assert "Wiki/0" in kept and "CC/2" in kept


def test_an_unlisted_curated_copy_is_kept_over_the_raw_crawls(tmp_path):
    """Unlisted datasets tied and the input's order decided: crawl shards (CC-MAIN-...) sort before curated-...,
    so the crawl's copy of an OpenWebText2 or Books3 document was kept (MT-NLG keeps the higher-quality one)."""
    rng = random.Random(4)
    text, other = prose(rng), prose(rng)
    crawl = [doc(0, text, "common-crawl"), doc(1, other, "common-crawl")]
    curated = [doc(0, edit(rng, text, 1), "OpenWebText2"), doc(1, other.upper(), "Books3")]
    stats, kept, aside = run(tmp_path, [crawl, curated])
    assert set(aside) == {"common-crawl/0", "common-crawl/1"}, set(aside)
    assert {aside[i]["duplicate_of_dataset"] for i in aside} == {"OpenWebText2", "Books3"}


def test_ties_keep_the_first_in_the_input_not_the_smallest_id_string(tmp_path):
    """Ids end in unpadded row numbers: by the smallest id, "CC/10" (a later copy) was kept over "CC/9"."""
    rng = random.Random(2)
    text, other = prose(rng), prose(rng)
    a = [doc(9, text, "CC"), doc(1, prose(rng), "CC"), doc(10, text.upper(), "CC")]  # an exact copy, later
    b = [doc(3, edit(rng, text, 1), "CC"), doc(11, other, "CC"), doc(100, edit(rng, other, 1), "CC")]  # fuzzy ones
    stats, kept, aside = run(tmp_path / "one", [a, b])
    assert set(aside) == {"CC/10", "CC/3", "CC/100"}, set(aside)
    assert aside["CC/10"]["duplicate_of"] == aside["CC/3"]["duplicate_of"] == "CC/9"
    assert aside["CC/100"]["duplicate_of"] == "CC/11"
    # the priority names datasets these documents do not have: said, not refused (a shared params file)
    assert stats["warnings"] == [f"dedup.priority names {n!r}, not a dataset of the input (CC): it ranks nothing"
                                 for n in ("Wiki", "Books")]


def test_verification_drops_lsh_false_positives(tmp_path):
    rng = random.Random(3)
    base = prose(rng, 200)
    docs = [doc(0, base, "CC"), doc(1, edit(rng, base, 1), "CC")]
    docs += [doc(10 + i, edit(rng, base, 12), "CC") for i in range(6)]  # Jaccard ~0.3-0.5 with the base
    # one row per band: almost every pair shares a band, the verification must reject the distant ones
    stats, kept, aside = run(tmp_path / "v", [docs], bands=64, rows=1)
    assert set(aside) == {"CC/1"} and stats["dedup"]["pairs_rejected"] > 0
    stats, kept, aside = run(tmp_path / "nv", [docs], bands=64, rows=1, verify=False)
    assert len(aside) == 7  # unverified, the loose LSH joins them all (datatrove's behaviour)


def test_bad_inputs(tmp_path):
    rng = random.Random(4)
    huge = prose(rng, 1_800_000)  # ~10 MB
    assert len(huge) > 10_000_000
    japanese = "".join(rng.choice("日本語の文章ですかきくけこさしすせそたちつてとなにぬねのはひふへほ。") for _ in range(2000))
    russian = " ".join("".join(rng.choice("абвгдежзиклмнопрстуфхцчшщэюя") for _ in range(6)) for _ in range(200))
    # no words: never duplicates (an empty text cannot come in: extract's suite requires a character)
    docs = [doc(0, "?", "CC"), doc(1, "!!! ... ???", "CC"), doc(2, "--", "CC"),
            doc(3, "two words", "CC"), doc(4, "Two, words!", "CC"), doc(5, "two other", "CC"),  # short
            doc(6, "word " * 1000, "CC"), doc(7, "word " * 10, "CC"),  # one repeated word: the same shingle set
            doc(8, huge, "CC"), doc(9, huge[:-20] + " extra", "CC"),
            doc(10, russian, "CC"), doc(11, russian.replace(" ", ", ", 3) + " конец", "CC"),
            doc(12, japanese, "CC"), doc(13, japanese[:-3] + "終わり", "CC")]
    stats, kept, aside = run(tmp_path / "w", [docs])
    assert {"CC/0", "CC/1", "CC/2", "CC/3", "CC/5", "CC/6", "CC/8", "CC/10", "CC/12"} <= set(kept)
    assert aside["CC/4"]["reason"] == "exact" and aside["CC/4"]["duplicate_of"] == "CC/3"
    assert aside["CC/7"]["reason"] == "fuzzy" and aside["CC/7"]["duplicate_of"] == "CC/6"
    assert aside["CC/9"]["duplicate_of"] == "CC/8" and aside["CC/11"]["duplicate_of"] == "CC/10"
    assert "CC/13" in kept  # unspaced Japanese is one "word" per run: word shingles cannot see the edit
    assert stats["docs_without_words"] == 3
    _, kept, aside = run(tmp_path / "c", [docs], shingle="char", ngram=5)
    assert aside["CC/13"]["duplicate_of"] == "CC/12"  # character shingles can


def test_a_component_of_100000_near_identical_documents(tmp_path):
    rng = random.Random(5)
    base = prose(rng, 60)
    docs = [doc(i, f"{base} tail{i}", "Books" if i == 77_777 else "CC") for i in range(100_000)]
    stats, kept, aside = run(tmp_path, [docs[:50_000], docs[50_000:]], recheck_docs=100)
    assert list(kept) == ["Books/77777"] and len(aside) == 99_999
    assert stats["dedup"]["largest_component"] == 100_000 and stats["dedup"]["fuzzy_components"] == 1


def test_rerun_resumes_and_a_threshold_change_redoes_only_the_later_passes(tmp_path):
    rng = random.Random(6)
    base = prose(rng)
    docs = [doc(i, edit(rng, base, 3 * i), "CC") for i in range(6)] + [doc(9, prose(rng), "Wiki")]
    lsh = {"bands": 16, "rows": 8}
    stats, _, _ = run(tmp_path, [docs[:4], docs[4:]], **lsh)
    again, _, _ = run(tmp_path, [docs[:4], docs[4:]], **lsh)
    assert again["up_to_date"]
    again = run_stage("dedup", parse_params({"paths": {"data_dir": str(tmp_path / "data")}, "dedup": {
        "input_stage": "extract", "priority": ["Wiki", "Books"], **lsh}}), skip_up_to_date=False)
    assert all(x["resumed"] == (x.get("shards") or 1) for x in again["passes"])
    loose, _, aside = run(tmp_path, [docs[:4], docs[4:]], threshold=0.5, **lsh)
    assert [x["resumed"] for x in loose["passes"]] == [2, 1, 16, 0, 0, 0]  # signatures and buckets reused
    assert loose["dedup"]["fuzzy_removed"] > stats["dedup"]["fuzzy_removed"]


def test_the_suite_finds_counts_that_do_not_add_up(tmp_path):
    rng = random.Random(7)
    base = prose(rng)
    stats, kept, aside = run(tmp_path, [[doc(0, base, "CC"), doc(1, edit(rng, base, 1), "CC")],
                                        [doc(2, prose(rng), "CC")], [doc(3, prose(rng), "CC")]])
    data = tmp_path / "data"
    out = sorted((data / "dedup/shards").glob("*.parquet"))[0]
    rows = pq.read_table(out).to_pylist()
    write_docs(out, rows + [{**rows[0], "id": "CC/sneaked-back"}])
    p = parse_params({"paths": {"data_dir": str(data)}, "dedup": {"input_stage": "extract", "priority": ["Wiki", "Books"]}})
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("dedup", p)
    # once, as the fact about the whole output it is (it was said once per shard, the two fine ones too)
    assert [f for f in failed.value.failures if "count_mismatch" in f] == \
        ["expect_column_values_to_be_between on column 'count_mismatch': 1 in the whole output"]
    # an output emptied of every document: no row carried the counts, and it passed
    saved = {f: pq.read_table(f).to_pylist() for f in sorted((data / "dedup/shards").glob("*.parquet"))}
    for f in saved:
        write_docs(f, [])
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("dedup", p)
    assert failed.value.failures == ["expect_column_values_to_be_between on column 'count_mismatch': 3 in the "
                                     "whole output"]
    for f, kept_rows in saved.items():
        write_docs(f, kept_rows)
    write_docs(out, rows)
    # the removed copy kept in place of its original (counts fine): the output is checked against the
    # components' decision (a review's mutation passed the suite before)
    removed = pq.read_table(sorted((data / "dedup/aside/shards").glob("*.parquet"))[0]).to_pylist()[0]
    write_docs(out, [{**rows[0], **{k: removed[k] for k in rows[0]}}] + rows[1:])
    with pytest.raises(ExpectationFailed, match="kept_but_removed"):
        validate_stage("dedup", p)


def test_the_suite_finds_a_keeper_of_lower_priority_or_itself_removed(tmp_path):
    """A review: a components pass keeping the copy of the lower-priority dataset (MT-NLG's rule inverted), or
    removing a document for a copy it removed too, passed the suite."""
    import numpy as np
    rng = random.Random(3)
    base = prose(rng)
    run(tmp_path, [[doc(0, base, "Wiki"), doc(1, edit(rng, base, 1), "CC"), doc(2, edit(rng, base, 2), "CC")]],
        priority=["Wiki", "Books"])
    data = tmp_path / "data"
    p = parse_params({"paths": {"data_dir": str(data)}, "dedup": {"input_stage": "extract", "priority": ["Wiki", "Books"]}})
    validate_stage("dedup", p)
    removed = data / "dedup/components/removed.npz"
    with np.load(removed) as z:
        dup_of, reason = z["dup_of"].copy(), z["reason"].copy()
    assert dup_of.tolist() == [-1, 0, 0]
    with removed.open("wb") as fh:  # Wiki's original removed for a CC copy, and the other copy for it
        np.savez(fh, dup_of=np.array([1, -1, 0]), reason=reason[[1, 0, 2]])
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("dedup", p)
    assert "expect_column_values_to_be_between on column 'removed_for_a_lower_priority_copy': 1 in the whole output " \
           "(e.g. Wiki/0 for CC/1)" in failed.value.failures
    assert "expect_column_values_to_be_between on column 'removed_for_a_removed_copy': 1 in the whole output " \
           "(e.g. CC/2 for Wiki/0)" in failed.value.failures
    with removed.open("wb") as fh:  # a near copy left in by the components: the re-check finds the pair
        np.savez(fh, dup_of=np.array([-1, -1, 0]), reason=np.array([0, 0, reason[2]]))
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("dedup", p)
    assert any(f.startswith("expect_column_values_to_be_between on column 'kept_pair_above_threshold': 1 unexpected")
               for f in failed.value.failures), failed.value.failures


def test_params_are_checked():
    from tasks.core.errors import ConfigError

    with pytest.raises(ConfigError, match="set both bands and rows"):
        parse_params({"dedup": {"bands": 4, "rows": 0}})
    with pytest.raises(ConfigError, match="exceeds num_perm"):
        parse_params({"dedup": {"bands": 20, "rows": 10}})
    with pytest.raises(ConfigError, match="priority names a dataset twice: CC"):
        parse_params({"dedup": {"priority": ["CC", "Wiki", "CC"]}})
    assert parse_params({}).dedup.lsh() == (20, 6)
    assert parse_params({"dedup": {"bands": 0, "rows": 0}}).dedup.lsh() == (9, 13)  # datasketch's derivation
