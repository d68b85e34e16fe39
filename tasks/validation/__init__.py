"""One great-expectations suite per stage, run on every output before the next stage starts.

A stage names its suite module in its declaration (`Stage.suite`); the module provides
`expectations()` and `batches(p, outputs_dir)` (the rows they check), and, where the stage has facts
about its whole output (counts against its own stats), `totals_expectations()` and
`totals(p, outputs_dir)` ({column: value}, checked as one row whatever the output holds)."""
from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

from tasks.core import registry
from tasks.core.config import PipelineParams
from tasks.core.identity import read_json
from tasks.core.passes import atomic_write_text
from tasks.core.runner import stats_path
from tasks.validation.runner import ExpectationFailed, ValidationReport, run_suite


def validate_stage(stage: str, p: PipelineParams, raise_on_failure: bool = True) -> ValidationReport | None:
    """Run the stage's suite on its output and record the result and its seconds in stats.json
    (a stage whose validation failed is not accepted as input by the next one)."""
    st = registry.stage(stage)
    if st.suite is None:
        return None  # the sample is the test fixture itself; it has no suite
    start = time.perf_counter()
    suite, outputs = importlib.import_module(st.suite), st.outputs(p.paths.data_dir)
    totals = (suite.totals_expectations(), suite.totals(p, outputs)) if hasattr(suite, "totals") else None
    report = run_suite(stage, suite.expectations(), suite.batches(p, outputs), Path(p.paths.data_dir) / "docs",
                       raise_on_failure=False, totals=totals)
    report.seconds = round(time.perf_counter() - start, 3)
    record_validation(p, stage, report)
    if report.failures and raise_on_failure:
        err = ExpectationFailed(stage, report.failures, report.docs)
        err.report = report
        raise err
    return report


def docs_index(p: PipelineParams, stage: str) -> Path:
    """The stage's Data Docs page (run_suite writes one site per stage under <data_dir>/docs)."""
    return Path(p.paths.data_dir) / "docs" / stage / "index.html"


def recorded_validation_stands(stage: str, p: PipelineParams) -> bool:
    """Whether a stage found up to date may keep the validation its stats.json records instead of being
    validated again: it has no suite, or that validation passed and its Data Docs site is there (a DVC
    output: without it `dvc repro` and the pipeline's `dvc commit` fail). Otherwise the caller runs the
    stage all the same (run_stage's skip_up_to_date=False: its passes resume, and the intermediate passes a
    suite reads, which a `dvc pull` does not bring, are made again) and validates it."""
    if registry.stage(stage).suite is None:
        return True
    v = (read_json(stats_path(p, stage)) or {}).get("validation") or {}
    return v.get("success") is True and docs_index(p, stage).is_file()


def validation_of(stage: str, p: PipelineParams, stats: dict) -> ValidationReport | None:
    """The stage's validation, given what run_stage returned: run now; or, for a stage found up to date whose
    outputs passed their validation (stats.json records the result), that record: its outputs are the ones
    validated, by the same suites (their code is part of the stage's key), and a suite may read intermediate
    passes that a `dvc pull` does not bring back."""
    v = stats.get("validation") or {}
    if stats.get("up_to_date") and v.get("success") is True:
        return ValidationReport(stage, v.get("batches", 0), v.get("expectations", 0), [],
                                str(docs_index(p, stage).resolve()),  # here, not where it was validated
                                stats.get("validation_seconds", 0.0), v.get("results", []))
    return validate_stage(stage, p)


def record_validation(p: PipelineParams, stage: str, report: ValidationReport) -> None:
    path = stats_path(p, stage)
    if not path.is_file():
        return
    stats = json.loads(path.read_text(encoding="utf-8"))
    stats["validation"] = {"success": report.success, "expectations": report.expectations,
                           "batches": report.batches, "failures": report.failures[:20],  # the first 20,
                           "failure_count": len(report.failures), "docs": report.docs,  # and how many in all
                           "results": report.results}
    stats["validation_seconds"] = report.seconds
    atomic_write_text(path, json.dumps(stats, indent=2, sort_keys=True) + "\n")


__all__ = ["ExpectationFailed", "ValidationReport", "recorded_validation_stands", "validate_stage", "validation_of"]
