"""Runs a stage's expectation suite over its output shards with great-expectations 1.x.

Shards are validated in batches of bounded size (the suites read only the columns they check and
replace `text` by its length); each stage's Data Docs site, <data_dir>/docs/<stage>/, is built once
per run (GX's site builder drops the pages of results its store does not hold, and a run's store holds
its own stage only: one site per stage keeps every stage's latest report), and <data_dir>/docs/index.html
lists the stages' reports. A violated expectation raises ExpectationFailed whose message names the expectation, the column, the
unexpected count and the shard (for a fact about the whole output, its value).
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd

from tasks.core.errors import ExpectationFailed, StageFailed

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


@dataclass
class ValidationReport:
    stage: str
    batches: int = 0
    expectations: int = 0
    failures: list[str] = field(default_factory=list)
    docs: str = ""
    seconds: float = 0.0
    # per expectation over all batches: {"expectation", "column", "unexpected", "passed"}
    results: list[dict] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return not self.failures


@dataclass
class Batch:
    """Rows of one or more output shards validated together (one GX run instead of one per shard:
    a checkpoint run costs ~0.25 s whatever its size). `shards` are (name, first row, end row), so
    a failing batch is re-checked shard by shard to name the shard."""

    frame: pd.DataFrame
    shards: list[tuple[str, int, int]]

    @property
    def name(self) -> str:
        return self.shards[0][0] if len(self.shards) == 1 else f"{self.shards[0][0]} .. {self.shards[-1][0]}"


class _TemplateCache:
    """jinja2 bytecode cache shared by every Data Docs view: great-expectations makes a new jinja
    Environment per rendered page and recompiles its ~17 templates each time (~0.45 s a build)."""

    def __init__(self):
        import jinja2

        class Cache(jinja2.BytecodeCache):
            store: dict = {}

            def load_bytecode(self, bucket):
                if bucket.key in self.store:
                    bucket.bytecode_from_string(self.store[bucket.key])

            def dump_bytecode(self, bucket):
                self.store[bucket.key] = bucket.bytecode_to_string()

        self.cache = Cache()

    def install(self) -> None:
        from great_expectations.render.view.view import DefaultJinjaView

        if getattr(DefaultJinjaView.__init__, "_cached", False):
            return
        original, cache = DefaultJinjaView.__init__, self.cache

        def init(view, *args, **kwargs):
            original(view, *args, **kwargs)
            view.env.bytecode_cache = cache

        init._cached = True
        DefaultJinjaView.__init__ = init


def _context(docs_dir: Path):
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    _TemplateCache().install()
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    ctx.add_data_docs_site(site_name="pipeline", site_config={
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir.resolve())},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    })
    return ctx


def _tally(result, table: dict) -> None:
    """Add one run's outcome per (expectation, column) to `table` (unexpected counts summed)."""
    for vr in result.run_results.values():
        for r in vr.results:
            c = r.expectation_config
            key = (c.type, c.kwargs.get("column", "<table>"))
            row = table.setdefault(key, {"expectation": key[0], "column": key[1], "unexpected": 0, "passed": True})
            n = r.result.get("unexpected_count")
            row["unexpected"] += n if isinstance(n, int) else (0 if r.success else 1)
            row["passed"] = row["passed"] and bool(r.success)


def _not_evaluated(info) -> str | None:
    """Why GX could not evaluate an expectation (a missing column, values of the wrong type), from its
    exception_info: one record, or one per metric."""
    for i in ([info] if "raised_exception" in info else list(info.values())):
        message = i.get("exception_message") if hasattr(i, "get") else None
        if message:
            return " ".join(str(message).split()).removeprefix("Error: ").rstrip(".")
    return None


def _failures(result) -> list[tuple[str, str, str]]:
    """(expectation, column, what was found): "N unexpected", "observed ..." (a table-level check), or
    "not evaluated: why" (GX reported 'None' unexpected for those)."""
    out = []
    for vr in result.run_results.values():
        for r in vr.results:
            if not r.success:
                c = r.expectation_config
                n, why = r.result.get("unexpected_count"), _not_evaluated(r.exception_info or {})
                found = (f"{n} unexpected" if n is not None else f"not evaluated: {why}" if why
                         else f"observed {r.result.get('observed_value')}")
                out.append((c.type, c.kwargs.get("column", "<table>"), found))
    return out


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# how GX's site builder reports an exception it caught: ... OSError: "[Errno 28] No space left on device".  Traceback: ...
_CAUGHT = re.compile(r'(\w+): "(?:\[Errno (\d+)\] )?(.*?)"\.  Traceback', re.S)


def build_docs(ctx, stage: str) -> None:
    """Build the stage's Data Docs site. GX's site builder catches an exception while writing a page
    (a full disk, a permission), logs it in 15 lines and goes on, leaving an incomplete report. Its
    logged errors are collected instead and the first one raised: an OSError with its errno (no path:
    a full disk then names the data folder, tasks.core.errors.naming_full_disk), else one line."""
    log, errors = logging.getLogger("great_expectations"), _Errors()
    propagate, log.propagate = log.propagate, False
    log.addHandler(errors)
    try:
        ctx.build_data_docs(site_names=["pipeline"])
    finally:
        log.removeHandler(errors)
        log.propagate = propagate
    if errors.messages:
        found = _CAUGHT.search(errors.messages[0])
        if found and found[2]:
            raise OSError(int(found[2]), found[3])
        cause = f"{found[1]}: {found[3]}" if found else errors.messages[0]
        raise StageFailed(f"{stage}: its Data Docs were not written: {' '.join(cause.split())}")


def _checkpoint(ctx, name: str, expectations: list, asset_name: str = "shards"):
    """A checkpoint running `expectations` (one suite) on the dataframe passed to each run."""
    import great_expectations as gx

    asset = ctx.data_sources.add_pandas(f"{name}_output").add_dataframe_asset(asset_name)
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"{name}_suite"))
    for e in expectations:
        suite.add_expectation(e)
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(
        name=name, data=asset.add_batch_definition_whole_dataframe("shard"), suite=suite))
    return ctx.checkpoints.add(gx.Checkpoint(
        name=f"{name}_checkpoint", validation_definitions=[vd], result_format="SUMMARY", actions=[]))


def _check_totals(ctx, stage: str, expectations: list, facts: dict, table: dict) -> list[str]:
    """Facts about the whole output (e.g. documents in it against the stage's own counts), one row checked
    by a suite of their own: carried on every document row they vanished with the rows (an output emptied
    by a bug passed) and failed once per shard, naming shards that were fine."""
    result = _checkpoint(ctx, f"{stage}_totals", expectations, asset_name="facts").run(
        batch_parameters={"dataframe": pd.DataFrame([facts])}, run_id=None)
    _tally(result, table)
    for (_, col), row in table.items():  # a failed fact's value (documents), not the one row that carried it
        if col in facts and isinstance(facts[col], int) and not row["passed"]:
            row["unexpected"] = facts[col]
    return [f"{t} on column '{col}': {facts[col] if col in facts else found} in the whole output"
            + (f" ({facts[col + '_where']})" if facts.get(col + "_where") else "") for t, col, found in _failures(result)]


NAMED_SHARDS = 10  # shards re-checked to name them, per batch, once that many failed: 300 shards with one fault
# each took 10x the validation and a 30,000-character line; 80,000 would take hours


def _lines(failed: list[tuple[str, str, str, str]], whole: list[tuple[str, str, str]], batch: Batch,
           checked: int) -> list[str]:
    """One line per failed (expectation, column) of a batch: the shard, or the batch's count, how many of
    its shards and the first three."""
    by_key: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for t, col, found, name in failed:
        by_key.setdefault((t, col), []).append((found, name))
    lines = []
    for (t, col), hits in by_key.items():
        if len(hits) == 1:
            lines.append(f"{t} on column '{col}': {hits[0][0]} in shard {hits[0][1]}")
            continue
        total = next((n for tt, cc, n in whole if (tt, cc) == (t, col)), hits[0][0])
        more = "" if checked == len(batch.shards) else " or more"
        names = ", ".join(name for _, name in hits[:3]) + (", ..." if len(hits) > 3 or more else "")
        lines.append(f"{t} on column '{col}': {total} in {len(hits)}{more} shards ({names}) of {batch.name}")
    return lines


def run_suite(stage: str, expectations: list, batches: Iterator[Batch],
              docs_dir: Path, raise_on_failure: bool = True,
              totals: tuple[list, dict] | None = None) -> ValidationReport:
    """`totals`: (expectations, {column: value}) on facts about the whole output, checked first."""
    site = docs_dir / stage
    ctx = _context(site)
    checkpoint = _checkpoint(ctx, stage, expectations)
    report = ValidationReport(stage, expectations=len(expectations) + len(totals[0] if totals else ()),
                              docs=str((site / "index.html").resolve()))
    table: dict = {}
    if totals is not None:
        report.failures += _check_totals(ctx, stage, *totals, table)
    for batch in batches:
        report.batches += 1
        result = checkpoint.run(batch_parameters={"dataframe": batch.frame}, run_id=None)
        _tally(result, table)
        whole = _failures(result)
        failed, checked = [], 0
        if whole and len(batch.shards) > 1:  # name the shard(s): re-check this batch's shards one by one
            for name, a, b in batch.shards:
                if len({s for *_, s in failed}) >= NAMED_SHARDS:  # a fault in every shard: named enough
                    break
                one = batch.frame.iloc[a:b].reset_index(drop=True)
                failed += [(t, col, n, name) for t, col, n in
                           _failures(checkpoint.run(batch_parameters={"dataframe": one}, run_id=None))]
                checked += 1
        seen = {(t, col) for t, col, *_ in failed}  # what no single shard shows: e.g. an id in two shards
        failed += [(t, col, n, batch.name) for t, col, n in whole if (t, col) not in seen]
        report.failures += _lines(failed, whole, batch, checked)
    report.results = list(table.values())
    build_docs(ctx, stage)  # once, after every batch (not per batch)
    write_index(docs_dir, stage, report)
    if report.failures and raise_on_failure:
        raise ExpectationFailed(stage, report.failures, report.docs)
    return report


def write_index(docs_dir: Path, stage: str, report: ValidationReport) -> None:
    """Record this stage's outcome beside its site and rewrite the index of every stage's report."""
    import json
    import time

    from tasks.core.passes import atomic_write_text

    atomic_write_text(docs_dir / stage / "summary.json", json.dumps({
        "stage": stage, "success": report.success, "expectations": report.expectations, "batches": report.batches,
        "failures": len(report.failures), "validated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, sort_keys=True) + "\n")
    refresh_index(docs_dir)


def refresh_index(docs_dir: Path) -> None:
    """Rewrite docs_dir/index.html from the stages' summary.json files (also when sites were restored by
    DVC without a validation: the docs server calls it as it starts). Under a lock: two stages validating
    at once each listed the summaries before the other's was written, and the index written last missed a row."""
    import fcntl

    docs_dir.mkdir(parents=True, exist_ok=True)
    with open(docs_dir / ".index.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_index(docs_dir)


def _write_index(docs_dir: Path) -> None:
    import html
    import json

    from tasks.core.passes import atomic_write_text
    from tasks.core.registry import PIPELINE

    rows = []
    for name in PIPELINE:
        f = docs_dir / name / "summary.json"
        if f.is_file():
            r = json.loads(f.read_text(encoding="utf-8"))
            result = "passed" if r["success"] else f"<b>FAILED</b> ({r['failures']} failures)"
            rows.append(f"<tr><td><a href=\"{html.escape(name)}/index.html\">{html.escape(name)}</a></td><td>{result}</td>"
                        f"<td>{r['expectations']}</td><td>{r['batches']}</td><td>{html.escape(r['validated_at'])}</td></tr>")
    atomic_write_text(docs_dir / "index.html", "<!doctype html><html><head><meta charset=\"utf-8\"><title>Data Docs: "
                      "every stage</title><style>body{font-family:sans-serif;margin:2em}td,th{padding:.3em 1em;"
                      "text-align:left}</style></head><body><h1>Validation of every stage</h1><p>Each stage's latest "
                      "great-expectations report (its suite and the results, shard by shard).</p><table><tr><th>stage"
                      "</th><th>result</th><th>expectations</th><th>batches</th><th>validated</th></tr>"
                      + "".join(rows) + "</table></body></html>\n")
