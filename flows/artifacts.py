"""What a user sees in the Prefect UI: one markdown artifact per stage (its stats, its passes, its
validation as a table, its plots, a Data Docs link that opens over http) and one summary artifact
on the pipeline run linking them all. Every later stage gets the same page from its stats.json."""
from __future__ import annotations

import functools
import html
import os
import re
from pathlib import Path

import httpx
from prefect.artifacts import create_markdown_artifact
from prefect.settings import PREFECT_UI_URL, get_current_settings

from flows.plots import data_uri, stage_plots
from tasks.core.config import PipelineParams, load_params
from tasks.core.errors import ConfigError
from tasks.validation import ValidationReport

_SKIP = {"stage", "passes", "dropped", "extra", "tasks", "validation", "failed_shards", "fewshot_k", "warnings",
         "fingerprint", "up_to_date"}


def _cell(v) -> str:
    """A table cell: markdown's column bar escaped, and HTML's characters (a table-level expectation's column is
    `<table>`, which the UI's renderer took for a tag: the V2 UI nested the rest of the table and the plots in it)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return html.escape(str(v), quote=False).replace("|", "\\|")


def docs_link(p: PipelineParams, stage: str | None = None) -> str:
    """The Data Docs index of every stage, or one stage's own report."""
    return f"{p.paths.docs_url.rstrip('/')}/{stage + '/' if stage else ''}index.html"


def docs_reference(p: PipelineParams, stage: str | None = None) -> str:
    """Markdown for the Data Docs of this run: the served link, where `make docs` / `make ui` serve them (the
    data_dir of params.yaml); the report's file otherwise (a UI run with another data_dir linked to the report
    of params.yaml's data, validated by another run)."""
    if _served(p.paths.data_dir):  # a stage's report under its name, the index of every stage under its address
        link = docs_link(p, stage)
        return f"{'[Data Docs]' if stage else f'Data Docs: [{link}]'}({link}) (served by `make docs` / `make ui`)"
    page = Path(p.paths.data_dir) / "docs" / (f"{stage}/" if stage else "") / "index.html"
    return f"Data Docs: `{page}` (this run's data_dir is not the one `make docs` / `make ui` serve)"


def _served(data_dir: str) -> bool:
    """Whether the docs server (flows.docs_server, params.yaml's data_dir) serves this data_dir's docs."""
    return _served_from(str(Path(data_dir).resolve()), os.getcwd())


@functools.cache
def _served_from(data_dir: str, project: str) -> bool:
    try:
        served = load_params(os.path.join(project, "params.yaml")).paths.data_dir
    except ConfigError:  # the server cannot start on it either: nothing to compare with
        return True
    return data_dir == str((Path(project) / served).resolve())


def artifact_url(artifact_id) -> str:
    """The UI page of an artifact, in the UI a browser opens by default (root-relative when the UI's address is
    not configured, a command-line run's temporary server: the V2 page where Prefect defaults to V2, as it does;
    `/artifacts/...` was V1's, and took a person out of V2)."""
    base = (PREFECT_UI_URL.value() or "").rstrip("/")
    if base:
        return f"{default_ui(base)}/artifacts/artifact/{artifact_id}"
    v2 = get_current_settings().server.ui.v2_enabled
    return f"{'/v2' if v2 else ''}/artifacts/artifact/{artifact_id}"


@functools.cache
def default_ui(ui_url: str) -> str:
    """The address of the UI the server sends a browser to: Prefect 3.8 serves two, V1 at the root and V2
    under /v2, and its root sends a browser with no saved choice to V2 (`server.ui.v2_enabled`), while a
    V1 page's address stays V1, so links to V1 pages took a person out of the UI they were using. The
    server says which it defaults to in /ui-settings; the root's address when it cannot be asked."""
    try:
        settings = httpx.get(f"{ui_url}/ui-settings", timeout=10).raise_for_status().json()
        path = settings[f"{settings['default_ui']}_base_url"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return ui_url
    url = httpx.URL(ui_url)
    return f"{url.scheme}://{url.netloc.decode()}{path.rstrip('/')}"


def stats_markdown(stats: dict, report: ValidationReport | None, p: PipelineParams, failure: str | None = None) -> str:
    stage = stats.get("stage", "?")
    lines = [f"## Stage `{stage}`", ""]
    if failure:
        lines += [f"**Failed:** {failure}", ""]
    if stats.get("up_to_date"):
        lines += ["**Up to date:** not run again. Its code, parameters and inputs are those of the run that made its "
                  "outputs, and the outputs are whole. The figures below are from that run.", ""]
    lines += [f"**Warning:** {_cell(w)}" + "  " for w in stats.get("warnings", [])] + [""] * bool(stats.get("warnings"))
    lines += ["| metric | value |", "|---|---|"]
    lines += [f"| {k.replace('_', ' ')} | {_cell(v)} |" for k, v in sorted(stats.items())
              if k not in _SKIP and not isinstance(v, (dict, list))]
    lines += [f"| dropped: {k} | {_cell(v)} |" for k, v in stats.get("dropped", {}).items()]
    lines += [f"| {k} | {_cell(v)} |" for k, v in stats.get("extra", {}).items() if "." not in k]  # per-task rows below
    for k, v in sorted(stats.items()):  # e.g. the sample's kinds, the index's bytes
        if k not in _SKIP and isinstance(v, dict) and all(not isinstance(x, (dict, list)) for x in v.values()):
            lines += [f"| {k.replace('_', ' ')}: {kk} | {_cell(vv)} |" for kk, vv in v.items()]
    if stats.get("failed_shards"):
        lines += ["", "Failed shards (skipped, retried on the next run):", "", "| shard | reason |", "|---|---|"]
        lines += [f"| {f['shard']} | {_cell(f['reason'])} |" for f in stats["failed_shards"]]
    if stats.get("passes"):
        lines += ["", "| pass | kind | shards | resumed | seconds |", "|---|---|---|---|---|"]
        lines += [f"| {x['name']} | {x['kind']} | {x.get('shards', 1)} | {x['resumed']} | {x['seconds']} |"
                  for x in stats["passes"]]
    if "tasks" in stats:  # decontamination: what each evaluation task's n-grams did
        cols = ["ngrams", "frequent_ngrams_ignored", "training_docs_matched", "training_docs_split",
                "training_docs_dropped", "training_chars_removed"]
        lines += ["", f"Task n-gram index: {stats.get('index_entries')} entries, "
                      f"{stats.get('index_total_bytes', 0) / 2**20:.1f} MiB", "",
                  "| task | " + " | ".join(c.replace("training_", "") for c in cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        lines += [f"| {t} | " + " | ".join(_cell(row.get(c, "")) for c in cols) + " |" for t, row in stats["tasks"].items()]
    if isinstance(stats.get("dedup"), dict):  # dedup: per dataset, and whose copies were removed for whose
        d = stats["dedup"]
        names = sorted(d.get("datasets", {}))
        lines += ["", f"Dedup: {d['exact_removed']:,} exact and {d['fuzzy_removed']:,} fuzzy duplicates removed of "
                      f"{d['docs']:,}; {d['fuzzy_components']:,} fuzzy components (largest {d['largest_component']:,}); "
                      f"LSH {d['lsh_bands']} bands x {d['lsh_rows']} rows, {d['pairs_checked']:,} candidate pairs "
                      f"checked, {d['pairs_rejected']:,} rejected", "",
                  "| dataset | documents | exact removed | fuzzy removed |", "|---|---|---|---|"]
        lines += [f"| {n} | {r['docs']:,} | {r['exact_removed']:,} | {r['fuzzy_removed']:,} |"
                  for n, r in sorted(d.get("datasets", {}).items())]
        m = d.get("removed_in_favour_of", {})
        lines += ["", "Removed (rows) in favour of (columns):", "",
                  "| removed \\ kept | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {a} | " + " | ".join(f"{m.get(a, {}).get(b, 0):,}" for b in names) + " |" for a in names]
    if isinstance(stats.get("filter"), dict):  # filter: per dataset, kept and dropped by reason
        rows = stats["filter"]["datasets"]
        lines += ["", "Filter: documents per dataset, kept and dropped by the first rule each failed", "",
                  "| dataset | documents | kept | kept fraction | dropped (reason: documents) |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {r['docs']:,} | {r['kept']:,} | {_cell(r['kept_fraction'])} | "
                  + ", ".join(f"{k}: {v:,}" for k, v in r["dropped"].items()) + " |" for n, r in rows.items()]
        if stats.get("classifier_auc") is not None:
            lines += ["", f"Quality classifier ({stats.get('classifier')}): held-out AUC {stats['classifier_auc']:.4f}"]
    if isinstance(stats.get("blend"), dict):  # tokenize: the blend, per dataset
        lines += ["", f"Blend: {stats.get('samples')} samples"
                      + (" (weights normalised to sum 1)" if stats.get("weights_normalised") else "")
                      + (f"; left out: {', '.join(stats['left_out'])}" if stats.get("left_out") else ""), "",
                  "| dataset | tokens | documents | target share | realised share | epochs |", "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {row['tokens']:,} | {row['documents']:,} | {row['target_share']:.4f} | "
                  f"{row['realised_share']:.4f} | {row['epochs']:.2f} |"
                  for name, row in sorted(stats["blend"].items(), key=lambda kv: -kv[1]["target_share"])]
    if isinstance(stats.get("profiles"), list):  # train: every profile validated and sized, the chosen one ran
        lines += ["", f"Profiles (the one that ran: `{stats.get('profile')}`), sized at the blend's vocabulary:", "",
                  "| profile | parameters | layout (tp x pp x dp) | GPUs | GiB per GPU (busiest stage) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['profile']} | {r['parameters']:,} | {r['layout']['tp']} x {r['layout']['pp']} x "
                  f"{r['layout']['dp']} | {r['gpus']:,} | {r['gib_per_gpu']} |" for r in stats["profiles"]]
    if isinstance(stats.get("accuracy"), dict):  # evaluate: MT-NLG Figure 3's table
        settings = [s for s in ("zero-shot", "one-shot", "few-shot") if any(s in r for r in stats["accuracy"].values())]
        k = stats.get("fewshot_k", {})
        lines += ["", "Accuracy (lm-evaluation-harness prompts and metrics):", "",
                  "| task | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
        lines += [f"| {t} | " + " | ".join(_cell(row.get(s, "")) + (f" (k={k[t]})" if s == "few-shot" and t in k else "")
                                           for s in settings) + " |" for t, row in stats["accuracy"].items()]
    if report is not None:
        status = "passed" if report.success else "FAILED"
        lines += ["", f"### Validation {status}", "",
                  f"{report.expectations} expectations over {report.batches} batch(es) in {report.seconds} s. "
                  + docs_reference(p, report.stage), "",
                  "| expectation | column | unexpected | passed |", "|---|---|---|---|"]
        lines += [f"| {_cell(r['expectation'])} | {_cell(r['column'])} | {_cell(r['unexpected'])} | "
                  f"{'yes' if r['passed'] else '**no**'} |" for r in report.results]
    for title, png in stage_plots(stats):
        lines += ["", f"### {title}", "", f"![{title}]({data_uri(png)})"]
    return "\n".join(lines)


def artifact_key(stage: str, suffix: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"{stage}-{suffix}".lower())


def publish(stats: dict, report: ValidationReport | None, p: PipelineParams, failure: str | None = None):
    """The stage's artifact; returns its id (the pipeline summary links to it)."""
    stage = stats.get("stage", "stage")
    return create_markdown_artifact(key=artifact_key(stage, "stats"), markdown=stats_markdown(stats, report, p, failure),
                                    description=f"stats.json and validation of stage {stage}")


def _validation_cell(val: dict | None) -> str:
    """A stage's validation in the summary: not run (no suite, or the stage stopped before it: its
    stats say pending), passed, or failed with its count."""
    if not val or val.get("success") is None:
        return "-" if not val else "not run"
    count = val.get("failure_count", len(val.get("failures", [])))  # stats.json keeps the first 20 only
    return "passed" if val["success"] else f"**failed** ({count} failures)"


def summary_markdown(rows: list[dict], p: PipelineParams, outcome: str) -> str:
    lines = [f"## Pipeline run: {outcome}", "",
             "| stage | docs in | docs out | dropped | seconds | validation | details |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        stats, val = r.get("stats") or {}, (r.get("stats") or {}).get("validation")
        check = _validation_cell(val)
        link = f"[artifact]({artifact_url(r['artifact'])})" if r.get("artifact") else ""
        state = f"**{r['error']}**" if r.get("error") else ""
        lines.append(f"| {r['stage']} | {_cell(stats.get('docs_in', '-'))} | {_cell(stats.get('docs_out', '-'))} | "
                     f"{_cell(sum(stats.get('dropped', {}).values()))} | "
                     f"{'up to date' if stats.get('up_to_date') else stats.get('wall_seconds', '-')} | "
                     f"{check} | {link} {state} |")
    lines += ["", docs_reference(p)]
    return "\n".join(lines)


def publish_summary(rows: list[dict], p: PipelineParams, outcome: str):
    return create_markdown_artifact(key="pipeline-summary", markdown=summary_markdown(rows, p, outcome),
                                    description="Every stage of this pipeline run, linking to each stage's artifact")
