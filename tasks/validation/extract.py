"""Expectations on `extract`: the document schema (tasks.validation.doc_checks)."""
from __future__ import annotations

from tasks.validation.doc_checks import batches, expectations

__all__ = ["batches", "expectations"]
