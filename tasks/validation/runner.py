"""Runs a stage's expectation suite over its output shards with great-expectations 1.x.

Each shard is validated as its own batch (bounded memory); every run lands in the Data Docs site
under <data_dir>/docs. A violated expectation raises ExpectationFailed whose message names the
expectation, the column, the unexpected count and the shard.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


class ExpectationFailed(RuntimeError):
    def __init__(self, stage: str, failures: list[str], docs: str):
        self.stage, self.failures, self.docs = stage, failures, docs
        super().__init__(f"stage '{stage}' failed validation: " + "; ".join(failures) + f" (Data Docs: {docs})")


@dataclass
class ValidationReport:
    stage: str
    batches: int = 0
    expectations: int = 0
    failures: list[str] = field(default_factory=list)
    docs: str = ""

    @property
    def success(self) -> bool:
        return not self.failures


def _context(docs_dir: Path):
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    ctx.add_data_docs_site(site_name="pipeline", site_config={
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir.resolve())},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    })
    return ctx


def run_suite(stage: str, expectations: list, batches: Iterator[tuple[str, pd.DataFrame]],
              docs_dir: Path, raise_on_failure: bool = True) -> ValidationReport:
    import great_expectations as gx

    ctx = _context(docs_dir)
    asset = ctx.data_sources.add_pandas(f"{stage}_output").add_dataframe_asset("shards")
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"{stage}_suite"))
    for e in expectations:
        suite.add_expectation(e)
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(
        name=stage, data=asset.add_batch_definition_whole_dataframe("shard"), suite=suite))
    checkpoint = ctx.checkpoints.add(gx.Checkpoint(
        name=f"{stage}_checkpoint", validation_definitions=[vd], result_format="SUMMARY",
        actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["pipeline"])]))
    report = ValidationReport(stage, expectations=len(expectations), docs=str((docs_dir / "index.html").resolve()))
    for name, df in batches:
        report.batches += 1
        result = checkpoint.run(batch_parameters={"dataframe": df}, run_id=None)
        for vr in result.run_results.values():
            for r in vr.results:
                if not r.success:
                    c = r.expectation_config
                    col = c.kwargs.get("column", "<table>")
                    n = r.result.get("unexpected_count", r.result.get("observed_value"))
                    report.failures.append(f"{c.type} on column '{col}': {n} unexpected in shard {name}")
    if report.failures and raise_on_failure:
        raise ExpectationFailed(stage, report.failures, report.docs)
    return report
