"""great-expectations suites: pass on real output, fail loudly on a deliberately broken shard."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tasks.core.config import parse_params
from tasks.core.schema import DOC_SCHEMA
from tasks.validation import ExpectationFailed, validate_stage
from tests.conftest import REPO, small_raw


def test_real_outputs_pass(extracted):
    for stage in ("download", "extract"):
        report = validate_stage(stage, extracted)
        assert report.success and report.batches >= 1
        assert report.docs == str((Path(extracted.paths.data_dir) / "docs" / stage / "index.html").resolve())
    docs = Path(extracted.paths.data_dir) / "docs"
    # every stage keeps its report (the second stage's build used to drop the first one's pages)
    for stage in ("download", "extract"):
        assert list((docs / stage).glob("validations/**/*.html")) and list((docs / stage).glob("expectations/*.html"))
        assert f'<a href="{stage}/index.html">{stage}</a></td><td>passed' in (docs / "index.html").read_text()


def break_a_shard(data: Path) -> str:
    shard = sorted((data / "extract/shards").glob("CC-*.parquet"))[0]
    rows = pq.read_table(shard).to_pylist()
    rows[1]["id"] = rows[0]["id"]  # a duplicate id
    rows[2]["lang"] = "English"  # not a language code
    rows[3]["lang"] = "EN"
    rows[4]["lang"] = "eng"  # the form of a code, but not a label of the model's
    pq.write_table(pa.Table.from_pylist(rows, schema=DOC_SCHEMA), shard)
    return shard.name


@pytest.fixture
def broken(extracted, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(extracted.paths.data_dir, data)
    shutil.rmtree(data / "docs", ignore_errors=True)  # none where no test of this worker validated yet
    name = break_a_shard(data)
    return parse_params(small_raw(data)), name


def test_broken_shard_fails_with_named_expectation_column_count(broken):
    p, name = broken
    with pytest.raises(ExpectationFailed) as e:
        validate_stage("extract", p)
    msg = str(e.value)
    assert f"expect_column_values_to_be_unique on column 'id': 2 unexpected in shard {name}" in msg
    assert f"expect_column_values_to_be_in_set on column 'lang': 3 unexpected in shard {name}" in msg
    assert len(e.value.failures) == 2
    docs = Path(p.paths.data_dir) / "docs"
    assert (docs / "index.html").is_file()
    assert list(docs.glob("extract/validations/**/*.html")), "the failing run must be in Data Docs"
    assert "FAILED</b> (2 failures)" in (docs / "index.html").read_text()


def test_an_output_shard_emptied_after_the_stage_fails_its_count(extracted, tmp_path):
    """Every document stage's output holds as many documents as its stats.json says: one emptied shard
    (or all of them) passed the row checks, which have nothing to check there."""
    data = tmp_path / "data"
    shutil.copytree(extracted.paths.data_dir, data, ignore=shutil.ignore_patterns("docs"))
    p = parse_params(small_raw(data))
    shard = sorted((data / "extract/shards").glob("CC-*.parquet"))[0]
    lost = pq.read_metadata(shard).num_rows
    pq.write_table(pq.read_table(shard).slice(0, 0), shard)
    with pytest.raises(ExpectationFailed) as e:
        validate_stage("extract", p)
    assert e.value.failures == [f"expect_column_values_to_be_between on column 'documents_unlike_stats': {lost} in "
                                f"the whole output"]


def test_unreadable_or_mistyped_shards_and_ids_in_two_batches_fail_naming_the_shards(extracted, tmp_path, monkeypatch):
    """A review of the suites on corrupted real outputs: a zero-byte shard or one whose columns have another type
    crashed the suite (exit 1, a bare Arrow error) and every shard typed alike passed; an id repeated in another
    batch of 500,000 rows passed."""
    from tasks.validation import doc_checks
    data = tmp_path / "data"
    shutil.copytree(extracted.paths.data_dir, data, ignore=shutil.ignore_patterns("docs"))
    p = parse_params(small_raw(data))
    first, second, *rest = sorted((data / "extract/shards").glob("*.parquet"))
    a, b = pq.read_table(first), pq.read_table(second)
    pq.write_table(b.set_column(0, "id", pa.array([a["id"][0].as_py()] + b["id"].to_pylist()[1:])), second)
    monkeypatch.setattr(doc_checks, "MAX_BATCH_ROWS", 1)  # a batch a shard: the two ids in two batches
    with pytest.raises(ExpectationFailed) as e:
        validate_stage("extract", p)
    assert e.value.failures == ["expect_column_values_to_be_between on column 'ids_in_two_shards': 1 in the whole "
                                f"output (e.g. in {first.name} and {second.name})"]
    rest[0].write_bytes(b"")
    mistyped = rest[1]
    t = pq.read_table(mistyped)
    pq.write_table(t.set_column(t.schema.get_field_index("lang_score"), "lang_score",
                                pa.array([str(x) for x in t["lang_score"].to_pylist()])), mistyped)
    with pytest.raises(ExpectationFailed) as e:
        validate_stage("extract", p)
    unreadable = next(f for f in e.value.failures if "'unreadable_shards'" in f)
    assert unreadable.startswith("expect_column_values_to_be_between on column 'unreadable_shards': 2 in the whole "
                                 f"output ({rest[0].name}: ArrowInvalid: ") and \
        f"{mistyped.name}: lang_score is string, not float" in unreadable


def test_stats_that_contradict_themselves_fail(extracted, tmp_path):
    """docs_in = docs_out + the drops, for a stage that takes or drops whole documents: a review set docs_in to
    100 more and the suite passed."""
    import json
    data = tmp_path / "data"
    shutil.copytree(extracted.paths.data_dir, data, ignore=shutil.ignore_patterns("docs"))
    stats_file = data / "extract/stats.json"
    stats = json.loads(stats_file.read_text())
    assert stats["docs_in"] == stats["docs_out"] + sum(stats["dropped"].values())
    stats_file.write_text(json.dumps({**stats, "docs_in": stats["docs_in"] + 100}))
    with pytest.raises(ExpectationFailed) as e:
        validate_stage("extract", parse_params(small_raw(data)))
    assert e.value.failures == ["expect_column_values_to_be_between on column 'stats_do_not_add_up': 100 in the "
                                "whole output"]


@pytest.mark.parametrize("damage", ['{"stage": "extract", "docs_in": 3,', "[1, 2]"])
def test_a_damaged_input_stats_file_is_an_unfinished_input_naming_it(extracted, tmp_path, damage):
    """An operator drill: extract's stats.json edited by hand gave 'error: JSONDecodeError: Expecting property
    name ...' (a list: "AttributeError: 'list' object has no attribute 'get'"), exit 1, naming no file."""
    from tasks.core.errors import UnfinishedInput
    from tasks.core.runner import run_stage
    data = tmp_path / "data"
    shutil.copytree(extracted.paths.data_dir, data, ignore=shutil.ignore_patterns("docs"))
    (data / "extract/stats.json").write_text(damage)
    with pytest.raises(UnfinishedInput, match=f"stage 'filter' needs stage 'extract' completed "
                                              f"\\({data / 'extract/stats.json'} is not a stage's stats\\): rerun"):
        run_stage("filter", parse_params(small_raw(data)))


def test_cli_never_marks_a_truncated_download_complete(broken, tmp_path):
    p, _ = broken
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p.model_dump(mode="json")))
    # re-running extract would recompute the shard; validate the download stage's manifest instead
    bad = Path(p.paths.data_dir) / "download/shards"
    warc = sorted(bad.glob("*.warc.gz"))[0]
    data = warc.read_bytes()
    marker = Path(p.paths.data_dir) / "download/completions" / f"warc-{warc.name}.json"
    marker.unlink()  # force the shard to rerun... from a server that now serves a broken file
    sample_warc = next((Path(p.paths.data_dir) / "sample").rglob(warc.name))
    sample_warc.chmod(0o644)
    sample_warc.write_bytes(data[:-50])
    out = subprocess.run([sys.executable, "-m", "tasks", "download"], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert out.returncode == 1, out.stderr[-2000:]
    assert "gzip stream is truncated or corrupt" in out.stderr
    assert not marker.exists(), "a half-downloaded file must never be marked complete"


def test_an_expectation_that_cannot_be_evaluated_says_why(tmp_path):
    """A missing column or values of the wrong type: GX cannot evaluate the expectation and reports
    'None' unexpected; the failure says why instead, and a table-level check says what it observed."""
    import pandas as pd

    from tasks.validation import doc_checks
    from tasks.validation.runner import Batch, run_suite

    frame = pd.DataFrame({"id": ["a", "b"], "text_chars": [3, 4], "dataset": ["x", "x"], "url": ["", ""],
                          "crawl": ["", ""], "lang_score": ["high", 0.5]})  # no lang; a score as text
    report = run_suite("extract", doc_checks.expectations(), iter([Batch(frame, [("s.parquet", 0, 2)])]),
                       tmp_path / "docs", raise_on_failure=False)
    assert ("expect_column_values_to_be_in_set on column 'lang': not evaluated: The column \"lang\" in BatchData "
            "does not exist in shard s.parquet") in report.failures, report.failures
    assert any(f.startswith("expect_column_values_to_be_between on column 'lang_score': not evaluated: ")
               for f in report.failures), report.failures
    assert ("expect_table_columns_to_match_ordered_list on column '<table>': observed "
            "['id', 'text_chars', 'dataset', 'url', 'crawl', 'lang_score'] in shard s.parquet") in report.failures
    assert not any("None unexpected" in f for f in report.failures), report.failures


def test_a_fault_in_every_shard_is_one_line_naming_a_few(tmp_path):
    """A review: 300 shards with an empty text each were re-checked one by one (10x the validation; at 80,000
    shards, hours) into 300 failures, a 30,000-character line on stderr and as the Prefect state's message."""
    import pandas as pd

    from tasks.validation import doc_checks
    from tasks.validation.runner import NAMED_SHARDS, Batch, run_suite

    n = 3 * NAMED_SHARDS
    frame = pd.DataFrame({"id": [f"d{i}" for i in range(2 * n)], "text_chars": [0, 5] * n, "dataset": ["x"] * 2 * n,
                          "url": [""] * 2 * n, "crawl": [""] * 2 * n, "lang": ["en"] * 2 * n, "lang_score": [0.9] * 2 * n})
    shards = [(f"s{i:03d}.parquet", 2 * i, 2 * i + 2) for i in range(n)]
    report = run_suite("extract", doc_checks.expectations(), iter([Batch(frame, shards)]), tmp_path / "docs",
                       raise_on_failure=False)
    assert report.failures == [f"expect_column_values_to_be_between on column 'text_chars': {n} unexpected in "
                               f"{NAMED_SHARDS} or more shards (s000.parquet, s001.parquet, s002.parquet, ...) of "
                               f"s000.parquet .. s{n - 1:03d}.parquet"]


def test_a_fact_about_the_whole_output_is_checked_once_whatever_the_rows(tmp_path):
    """Counts against a stage's own stats were carried on every row: an output emptied by a bug passed
    (no row, no check), and a mismatch failed once per shard, naming shards that were fine."""
    import great_expectations as gx
    import pandas as pd

    from tasks.core.schema import COLUMNS
    from tasks.validation import doc_checks
    from tasks.validation.runner import Batch, run_suite

    def totals(mismatch: int):  # new expectations for each suite (GX refuses one in two suites)
        return ([gx.expectations.ExpectColumnValuesToBeBetween(column="count_mismatch", min_value=0, max_value=0)],
                {"count_mismatch": mismatch})

    empty = pd.DataFrame({c: [] for c in [COLUMNS[0], "text_chars", *COLUMNS[2:]]})
    report = run_suite("dedup", doc_checks.expectations(), iter([Batch(empty, [("s.parquet", 0, 0)])]),
                       tmp_path / "docs", raise_on_failure=False, totals=totals(7))
    assert report.failures == ["expect_column_values_to_be_between on column 'count_mismatch': 7 in the whole output"]
    assert report.expectations == len(doc_checks.expectations()) + 1
    row = {"id": "a", "text_chars": 3, "dataset": "x", "url": "", "crawl": "", "lang": "en", "lang_score": 0.9}
    two = [Batch(pd.DataFrame([{**row, "id": f"{k}"}]), [(f"s{k}.parquet", 0, 1)]) for k in range(2)]
    report = run_suite("dedup", doc_checks.expectations(), iter(two), tmp_path / "docs2", raise_on_failure=False,
                       totals=totals(7))
    assert report.failures == ["expect_column_values_to_be_between on column 'count_mismatch': 7 in the whole output"]
    # the artifact's and stats.json's count is the fact's value, not the one row that carried it
    assert {"expectation": "expect_column_values_to_be_between", "column": "count_mismatch", "unexpected": 7,
            "passed": False} in report.results
    assert run_suite("dedup", doc_checks.expectations(), iter(two[:1]), tmp_path / "docs3", totals=totals(0)).success


def test_a_null_text_or_language_is_refused(tmp_path):
    """GX's range and set expectations pass nulls: a document with no text or no language passed the
    document checks (a review's mutation, on a shard adopted as it was)."""
    import pandas as pd

    from tasks.validation import doc_checks
    from tasks.validation.runner import Batch, run_suite

    frame = pd.DataFrame({"id": ["a", "b"], "text_chars": [None, 4], "dataset": ["x", "x"], "url": ["", ""],
                          "crawl": ["", ""], "lang": ["en", None], "lang_score": [0.9, 0.5]})
    report = run_suite("extract", doc_checks.expectations(), iter([Batch(frame, [("s.parquet", 0, 2)])]),
                       tmp_path / "docs", raise_on_failure=False)
    assert "expect_column_values_to_not_be_null on column 'text_chars': 1 unexpected in shard s.parquet" \
        in report.failures, report.failures
    assert "expect_column_values_to_not_be_null on column 'lang': 1 unexpected in shard s.parquet" \
        in report.failures, report.failures
