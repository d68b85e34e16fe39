"""The stage artifact's markdown (flows.artifacts): what a user reads in the Prefect UI."""
from __future__ import annotations

from flows.artifacts import stats_markdown
from tasks.core.config import parse_params


def test_warnings_stand_above_the_table_and_are_not_metrics():
    stats = {"stage": "dedup", "docs_in": 3, "docs_out": 2, "warnings": ["dedup.priority names 'Wiki', not a dataset "
                                                                         "of the input (CC|web): it ranks nothing"]}
    text = stats_markdown(stats, None, parse_params({}))
    head, table = text.split("| metric | value |")
    assert "**Warning:** dedup.priority names 'Wiki', not a dataset of the input (CC\\|web): it ranks nothing" in head
    assert "warnings" not in table and "| docs in | 3 |" in table
    assert "Warning" not in stats_markdown({"stage": "dedup", "docs_in": 3}, None, parse_params({}))
