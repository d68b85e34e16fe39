"""Do our rules drop what datatrove's filters drop, on real text? Per rule group (Gopher repetition, Gopher
quality, C4 lines) and per source, the fraction of documents on which our decision (the group alone, from
params.yaml's thresholds) equals datatrove's filter's (GopherRepetitionFilter, GopherQualityFilter,
C4QualityFilter, their defaults: the same thresholds), and for pages both keep, whether C4's edited text
is the same. Sources: the evaluation sets' own prose in paths.benchmarks_dir (LAMBADA's novels, BoolQ's
Wikipedia passages, RACE's exam articles), which no generator of ours wrote.

    python -m benchmarks.filter_agreement [--per-source 1000]   (needs the `bench` extra: datatrove)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa

from benchmarks import at_least
from tasks.core.config import PipelineParams, load_params
from tasks.filter.rules import apply_rules

GROUPS = ("gopher_repetition", "gopher_quality", "c4")


def real_texts(benchmarks_dir: Path, per_source: int) -> dict[str, list[str]]:
    lambada = [json.loads(x)["text"] for x in (benchmarks_dir / "lambada/lambada_test.jsonl").open(encoding="utf-8")]
    boolq = [json.loads(x)["passage"] for x in (benchmarks_dir / "boolq/dev.jsonl").open(encoding="utf-8")]
    race = [json.loads(f.read_text(encoding="utf-8"))["article"]
            for f in sorted((benchmarks_dir / "race/test/high").iterdir())[:per_source]]
    return {"lambada": lambada[:per_source], "boolq": boolq[:per_source], "race-h": race}


def ours(texts: list[str], group: str, p: PipelineParams) -> tuple[list[bool], list[str]]:
    """(kept, text after C4's edits) with only `group` applied."""
    skip = [g for g in ("language", *GROUPS) if g != group]
    # "x" among the datasets the rules apply to: since b4b5030 they apply to filter.rules_datasets only (the
    # crawl), and on "x" alone this compared datatrove with no rule at all (0.212 printed for 0.994)
    f = p.filter.model_copy(update={"rules_datasets": ["x"], "exempt": {"x": skip}})
    n = len(texts)
    table = pa.table({"id": [str(i) for i in range(n)], "text": texts, "dataset": ["x"] * n, "url": [""] * n,
                      "crawl": [""] * n, "lang": ["en"] * n, "lang_score": [1.0] * n})
    reason, edited, _ = apply_rules(table, f)
    return [bool(r == 0) for r in reason], [e if e is not None else t for e, t in zip(edited, texts)]


def theirs(texts: list[str], group: str) -> tuple[list[bool], list[str]]:
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter

    f = {"gopher_repetition": GopherRepetitionFilter, "gopher_quality": GopherQualityFilter,
         "c4": C4QualityFilter}[group]()
    kept, out = [], []
    for i, t in enumerate(texts):
        doc = Document(text=t, id=str(i))
        kept.append(f.filter(doc) is True)
        out.append(doc.text)
    return kept, out


def agreement(p: PipelineParams, per_source: int) -> dict[str, dict[str, dict]]:
    rows: dict[str, dict[str, dict]] = {}
    dropped = 0
    for source, texts in real_texts(Path(p.paths.benchmarks_dir), per_source).items():
        for group in GROUPS:
            (a, at), (b, bt) = ours(texts, group, p), theirs(texts, group)
            both = [i for i in range(len(texts)) if a[i] and b[i]]
            dropped += a.count(False)
            rows.setdefault(group, {})[source] = {
                "docs": len(texts), "agree": sum(x == y for x, y in zip(a, b)) / len(texts),
                "only_ours_drop": sum(y and not x for x, y in zip(a, b)),
                "only_theirs_drop": sum(x and not y for x, y in zip(a, b)),
                "same_text_when_kept": sum(at[i].strip() == bt[i].strip() for i in both) / max(len(both), 1)}
    if not dropped:  # the figure would compare datatrove with nothing
        raise SystemExit("filter_agreement: our rules dropped none of the texts: they were not applied")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-source", type=at_least(1), default=1000)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    try:
        import datatrove  # noqa: F401
    except ImportError:
        ap.error("needs datatrove, the `bench` extra: pip install -e '.[bench]'")
    rows = agreement(load_params(args.params), args.per_source)
    for group, by_source in rows.items():
        for source, r in by_source.items():
            print(f"{group:17s} {source:8s} {r['docs']:5,} docs: same decision {r['agree']:.4f} (only we drop "
                  f"{r['only_ours_drop']}, only datatrove drops {r['only_theirs_drop']})"
                  + (f", same text when both keep {r['same_text_when_kept']:.4f}" if group == "c4" else ""))
    worst = min(r["agree"] for by_source in rows.values() for r in by_source.values())
    print(f"filter_min_agreement_with_datatrove={worst:.4f}")


if __name__ == "__main__":
    main()
