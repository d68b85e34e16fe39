"""One great-expectations suite per stage, run on every output before the next stage starts.

A stage names its suite module in its declaration (`Stage.suite`); the module provides
`expectations()` and `batches(p, outputs_dir)`."""
from __future__ import annotations

import importlib
from pathlib import Path

from tasks.core import registry
from tasks.core.config import PipelineParams
from tasks.validation.runner import ExpectationFailed, ValidationReport, run_suite


def validate_stage(stage: str, p: PipelineParams, raise_on_failure: bool = True) -> ValidationReport | None:
    st = registry.stage(stage)
    if st.suite is None:
        return None  # the sample is the test fixture itself; it has no suite
    suite = importlib.import_module(st.suite)
    return run_suite(stage, suite.expectations(), suite.batches(p, st.outputs(p.paths.data_dir)),
                     Path(p.paths.data_dir) / "docs", raise_on_failure)


__all__ = ["ExpectationFailed", "ValidationReport", "validate_stage"]
