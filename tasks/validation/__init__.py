"""One great-expectations suite per stage, run on every output before the next stage starts."""
from __future__ import annotations

from pathlib import Path

from tasks.config import PipelineParams
from tasks.validation import decontaminate, documents, download
from tasks.validation.runner import ExpectationFailed, ValidationReport, run_suite

SUITES = {"download": download, "extract": documents, "decontaminate": decontaminate}


def validate_stage(stage: str, p: PipelineParams, raise_on_failure: bool = True) -> ValidationReport | None:
    if stage not in SUITES:
        return None  # the sample is the test fixture itself; it has no suite
    suite = SUITES[stage]
    data = Path(p.paths.data_dir)
    return run_suite(stage, suite.expectations(), suite.batches(p, data / stage / "shards"), data / "docs",
                     raise_on_failure)


__all__ = ["ExpectationFailed", "ValidationReport", "validate_stage", "SUITES"]
