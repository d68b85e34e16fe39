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
    lines += [f"| dropped: {k} | {v} |" for k, v in stats.get("dropped", {}).items()]
    lines += [f"| {k} | {v} |" for k, v in stats.get("extra", {}).items() if "." not in k]  # per-task rows below
    if "tasks" in stats:  # decontamination: what each evaluation task's n-grams did
        cols = ["ngrams", "frequent_ngrams_ignored", "training_docs_matched", "training_docs_split",
                "training_docs_dropped", "training_chars_removed"]
        lines += ["", f"Task n-gram index: {stats.get('index_entries')} entries, "
                      f"{stats.get('index_total_bytes', 0) / 2**20:.1f} MiB", "",
                  "| task | " + " | ".join(c.replace("training_", "") for c in cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        lines += [f"| {t} | " + " | ".join(str(row.get(c, "")) for c in cols) + " |" for t, row in stats["tasks"].items()]
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
