"""The stage artifact's markdown (flows.artifacts): what a user reads in the Prefect UI."""
from __future__ import annotations

import json

from flows.artifacts import default_ui, stats_markdown
from tasks.core.config import parse_params


def test_links_go_to_the_root_s_pages_when_the_server_cannot_say_which_ui_it_defaults_to():
    from tests.conftest import free_port
    ui = f"http://127.0.0.1:{free_port()}"  # nothing listens there (the V2 default: tests/test_prefect.py)
    assert default_ui(ui) == ui


def test_warnings_stand_above_the_table_and_are_not_metrics():
    stats = {"stage": "dedup", "docs_in": 3, "docs_out": 2, "warnings": ["dedup.priority names 'Wiki', not a dataset "
                                                                         "of the input (CC|web): it ranks nothing"]}
    text = stats_markdown(stats, None, parse_params({}))
    head, table = text.split("| metric | value |")
    assert "**Warning:** dedup.priority names 'Wiki', not a dataset of the input (CC\\|web): it ranks nothing" in head
    assert "warnings" not in table and "| docs in | 3 |" in table
    assert "Warning" not in stats_markdown({"stage": "dedup", "docs_in": 3}, None, parse_params({}))


def test_the_summary_reads_a_stage_stopped_before_its_validation():
    """A stage whose validation never ran (the disk filled while Data Docs were written) leaves stats.json
    saying the validation is pending: the run's summary says so (it failed with KeyError 'failures')."""
    from flows.artifacts import summary_markdown
    rows = [{"stage": "extract", "stats": {"docs_in": 5, "docs_out": 4, "validation": {"success": True, "failures": []}}},
            {"stage": "filter", "stats": {"docs_in": 4, "docs_out": 3, "validation": {"success": False,
                                                                                    "failures": ["a", "b"]}}},
            {"stage": "dedup", "stats": {"docs_in": 3, "validation": {"success": None, "pending": True}},
             "error": "I/O error: No space left on device (ENOSPC) writing under data (0 B free there)"},
            {"stage": "sample", "stats": {}}]
    lines = summary_markdown(rows, parse_params({}), "failed").splitlines()
    assert "| passed |" in lines[4] and "| **failed** (2 failures) |" in lines[5]
    assert "| not run |" in lines[6] and "**I/O error: No space left on device (ENOSPC)" in lines[6]
    assert lines[7].split("|")[6] == " - "


def test_the_summary_counts_every_failure_not_the_20_stats_json_keeps(tmp_path):
    from flows.artifacts import summary_markdown
    from tasks.validation import ValidationReport, record_validation
    p = parse_params({"paths": {"data_dir": str(tmp_path)}})
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "stats.json").write_text('{"stage": "extract"}')
    record_validation(p, "extract", ValidationReport("extract", failures=[f"failure {i}" for i in range(57)]))
    val = json.loads((tmp_path / "extract" / "stats.json").read_text())["validation"]
    assert len(val["failures"]) == 20 and val["failure_count"] == 57
    lines = summary_markdown([{"stage": "extract", "stats": {"validation": val}}], p, "failed").splitlines()
    assert "| **failed** (57 failures) |" in lines[4], lines[4]


def test_a_stage_found_up_to_date_says_so_and_its_key_is_no_metric():
    from flows.artifacts import summary_markdown
    stats = {"stage": "dedup", "docs_in": 3, "wall_seconds": 41.5, "up_to_date": True,
             "fingerprint": {"stage": "ab12", "outputs": "cd34"}}
    head, table = stats_markdown(stats, None, parse_params({})).split("| metric | value |")
    assert "**Up to date:** not run again" in head and "The figures below are from that run" in head
    assert "fingerprint" not in table and "up to date" not in table
    rows = [{"stage": "dedup", "stats": stats}, {"stage": "extract", "stats": {**stats, "up_to_date": False}}]
    lines = summary_markdown(rows, parse_params({}), "completed").splitlines()
    assert lines[4].split("|")[5] == " up to date " and lines[5].split("|")[5] == " 41.5 "
    assert "Up to date" not in stats_markdown({**stats, "up_to_date": False}, None, parse_params({}))


def test_a_flow_logs_the_stages_warnings_before_its_failed_validation(tmp_path):
    """As the command line prints them (tests/test_curated.py): the warning that may explain a failed
    validation is logged in the stage's run before the failure."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.test_curated import a_failed_validation_planted, a_project_whose_download_warns
    a_project_whose_download_warns(tmp_path)
    failing = a_failed_validation_planted("flows.stages", "from flows.pipeline import main; sys.exit(main(['params.yaml', 'download']))")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # a temporary server of its own
    out = subprocess.run([sys.executable, "-c", failing], cwd=tmp_path, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(REPO)}, timeout=600)
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-3000:]
    warned = out.stderr.find("WARNING | Flow run")  # Prefect's log lines, all on stderr
    failed = out.stderr.find("stage 'download' failed validation: a planted failure")
    assert 0 <= warned < failed, out.stderr[-3000:]
    assert "download: download.curated: 1 documents have no dataset name" in out.stderr[warned:failed]


def test_the_validation_table_escapes_html_and_links_only_the_docs_that_are_served(tmp_path, monkeypatch):
    """A UI drill: a table-level expectation's column `<table>` was taken for a tag (the V2 UI nested the rest of
    the table and the plots in it), and a run with another data_dir linked to params.yaml's data's report,
    which another run had validated."""
    import yaml
    from tasks.validation import ValidationReport
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"paths": {"data_dir": "data"}}))
    report = ValidationReport("extract", expectations=1, results=[
        {"expectation": "expect_table_row_count_to_be_between", "column": "<table>", "unexpected": 0, "passed": True}])
    text = stats_markdown({"stage": "extract"}, report, parse_params({}))
    assert "| expect_table_row_count_to_be_between | &lt;table&gt; | 0 | yes |" in text and "<table>" not in text
    assert "[Data Docs](http://127.0.0.1:" in text
    other = parse_params({"paths": {"data_dir": str(tmp_path / "data_exp")}})
    text = stats_markdown({"stage": "extract"}, report, other)
    assert "[Data Docs]" not in text
    assert f"Data Docs: `{tmp_path / 'data_exp' / 'docs' / 'extract' / 'index.html'}` (this run's data_dir" in text


def test_a_command_line_runs_links_open_the_v2_ui(monkeypatch):
    """A UI drill: a command-line run (a temporary server, no UI address) linked `/artifacts/artifact/<id>`, V1's
    page, which took a person out of the V2 UI that Prefect opens by default."""
    from flows.artifacts import artifact_url
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    assert artifact_url("abc") == "/v2/artifacts/artifact/abc"
