"""Expectations on `extract`: the document schema (tasks.validation.doc_checks), at least one
document (an extract stage that writes nothing from its input has failed), and as many as stats.json says."""
from __future__ import annotations

from tasks.validation import doc_checks
from tasks.validation.doc_checks import batches, totals, totals_expectations

__all__ = ["batches", "expectations", "totals", "totals_expectations"]


def expectations() -> list:
    return doc_checks.expectations(require_rows=True)
