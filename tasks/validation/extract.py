"""Expectations on `extract`: the document schema (tasks.validation.doc_checks), and at least one
document (an extract stage that writes nothing from its input has failed)."""
from __future__ import annotations

from tasks.validation import doc_checks
from tasks.validation.doc_checks import batches

__all__ = ["batches", "expectations"]


def expectations() -> list:
    return doc_checks.expectations(require_rows=True)
