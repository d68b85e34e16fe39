"""Markdown artifacts: each stage publishes its stats and a link to its Data Docs."""
from __future__ import annotations

import re

from prefect.artifacts import create_markdown_artifact

from tasks.validation import ValidationReport


def stats_markdown(stats: dict, report: ValidationReport | None, failure: str | None = None) -> str:
    stage = stats.get("stage", "?")
    rows = [("shards", stats.get("shards")), ("docs in", stats.get("docs_in")), ("docs out", stats.get("docs_out")),
            ("bytes in", stats.get("bytes_in")), ("bytes out", stats.get("bytes_out")),
            ("resumed shards", stats.get("resumed_shards")), ("seconds", stats.get("wall_seconds"))]
    lines = [f"## Stage `{stage}`", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows if v is not None]
    for k, v in {**stats.get("dropped", {}), **{f"extra: {k}": v for k, v in stats.get("extra", {}).items()}}.items():
        lines.append(f"| dropped: {k} | {v} |" if not k.startswith("extra: ") else f"| {k} | {v} |")
    if report is not None:
        status = "passed" if report.success else "FAILED"
        lines += ["", f"Validation **{status}**: {report.expectations} expectations over {report.batches} "
                      f"batch(es). [Data Docs](file://{report.docs})"]
    if failure:
        lines += ["", f"**Failure:** {failure}"]
    return "\n".join(lines)


def publish(stats: dict, report: ValidationReport | None, failure: str | None = None) -> None:
    key = re.sub(r"[^a-z0-9-]", "-", f"{stats.get('stage', 'stage')}-stats".lower())
    create_markdown_artifact(key=key, markdown=stats_markdown(stats, report, failure),
                             description=f"stats.json of stage {stats.get('stage')}")
