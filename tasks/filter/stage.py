"""Stage `filter`: heuristic rules, then GPT-3's quality classifier, between extract and dedup.
Passes and what each writes: tasks.filter.passes."""
from __future__ import annotations

from tasks.core.config import PipelineParams
from tasks.core.stage import GlobalPass, ShardedPass, Stage, absent_datasets
from tasks.filter.passes import (BINS, aside_shard, build_classifier, check_classifier_names, classifier_inputs,
                                 keep_shard, plan_outputs, plan_rules, plan_scores, rules_shard, score_shard)
from tasks.filter.textstats import N_FIXED

NAME = "filter"
RULES_VERSION = 3  # part of the rules pass's fingerprint: change it when a rule's computation changes
# (2: spaCy-like tokens; 3: spaCy's infixes, URLs, units and number periods; blank lines of whitespace)


def rule_params(p: PipelineParams) -> dict:
    f = p.filter
    return {"version": RULES_VERSION, "stats": N_FIXED, "batch_docs": f.batch_docs,
            **f.model_dump(mode="json", include={"language", "gopher_quality", "gopher_repetition", "c4", "exempt",
                                                 "rules_datasets"})}


def classifier_params(p: PipelineParams) -> dict:
    c = p.filter.classifier
    return c.model_dump(mode="json", exclude={"alpha", "min_kept", "max_kept", "min_scored_docs"})


def report(stats: dict) -> dict:
    """stats.json's `filter`: per dataset the documents in, kept and dropped by reason; the score histograms."""
    datasets: dict[str, dict] = {}
    hist: dict[str, list[int]] = {}
    for k, v in stats.get("extra", {}).items():
        kind, name, last = (k.split("|") + ["", ""])[:3]
        if kind == "filter.hist":
            hist.setdefault(name, [0] * BINS)[int(last)] += v
        elif kind == "filter.ds":
            row = datasets.setdefault(name, {"docs": 0, "kept": 0, "dropped": {}})
            row["docs"] += v
            if last == "kept":
                row["kept"] += v
            else:
                row["dropped"][last] = v
    for row in datasets.values():
        row["kept_fraction"] = round(row["kept"] / row["docs"], 6) if row["docs"] else None
        row["dropped"] = dict(sorted(row["dropped"].items()))
    return {"filter": {"datasets": dict(sorted(datasets.items())), "score_histogram": dict(sorted(hist.items())),
                       "bins": BINS}}


def plot_files(stats: dict) -> dict[str, str]:
    """`dvc plots show`: the classifier's score histogram, one CSV per dataset."""
    out = {}
    for name, counts in stats.get("filter", {}).get("score_histogram", {}).items():
        slug = "".join(ch if ch.isalnum() else "_" for ch in name).strip("_").lower()
        rows = [f"{(b + 0.5) / BINS:.3f},{n}" for b, n in enumerate(counts)]
        out[f"plots/scores_{slug}.csv"] = "score,documents\n" + "\n".join(rows) + "\n"
    return out


MIN_TRAIN_DOCS = 50  # per class: fewer, and the fit is mostly noise (2 positives gave an AUC of 0.40, keeping all)
WEAK_AUC = 0.55  # against the crawl pages it scores: near 0.5 the Pareto rule keeps them almost at random


def classifier_warnings(stats: dict) -> list[str]:
    """A trained classifier too weak to mean much: validation passes it (its kept fractions are in bounds), and
    it kept 22 of 31 SEO-spam pages trained on 15 curated documents per dataset, without a word."""
    if stats.get("classifier") != "trained":
        return []
    out = []
    few = [f"{n:,} {what}" for what in ("positives", "negatives")
           if (n := stats.get(f"classifier_train_{what}")) is not None and n < MIN_TRAIN_DOCS]
    if few:
        out.append(f"filter.classifier: trained on {' and '.join(few)} (fewer than {MIN_TRAIN_DOCS}): its scores say "
                   f"little; more curated or crawl documents, or a model trained elsewhere (classifier.model_path)")
    auc = stats.get("classifier_auc_scored")
    if auc is not None and auc < WEAK_AUC:
        out.append(f"filter.classifier: held-out AUC {auc:.3f} against the crawl pages it scores (0.5: chance): the "
                   f"Pareto rule keeps them almost at random")
    return out


def warnings(stats: dict, p: PipelineParams) -> list[str]:
    present, c = stats.get("filter", {}).get("datasets", {}), p.filter.classifier
    trained = c.enabled and not c.model_path
    unruled = [f"filter.exempt names {n!r}, which filter.rules_datasets does not: the rules never apply to it"
               for n in p.filter.exempt if n not in p.filter.rules_datasets]
    return (unruled + absent_datasets("filter.rules_datasets", p.filter.rules_datasets, present,
                                      "no document goes through the rules for it")
            + absent_datasets("filter.exempt", p.filter.exempt, present, "no document skips a rule for it")
            + absent_datasets("filter.classifier.positives", c.positives if trained else [], present,
                              "the classifier trains on the others")
            + absent_datasets("filter.classifier.negatives", c.negatives if trained else [], present,
                              "the classifier trains on the others")
            + classifier_warnings(stats))


STAGE = Stage(
    # dvc.yaml deps: its package and the code it imports (tests/test_layout.py checks it is all here)
    code=("tasks/filter", "tasks/extract/__init__.py", "tasks/extract/langid.py", "tasks/extract/fasttext_lid.py"),
    name=NAME, section="filter", input=lambda p: p.filter.input_stage,
    doc="Heuristic rules (language, Gopher quality and repetition, C4 lines), then GPT-3's quality classifier.",
    passes=(
        ShardedPass("rules", plan=plan_rules, process=rules_shard, params=rule_params),
        GlobalPass("classifier", build=build_classifier, params=classifier_params, inputs=classifier_inputs),
        ShardedPass("score", plan=plan_scores, process=score_shard,
                    params=lambda p: {**classifier_params(p), "alpha": p.filter.classifier.alpha}),
        ShardedPass("aside", plan=plan_outputs, process=aside_shard, params=lambda p: {"batch_docs": p.filter.batch_docs}),
        ShardedPass("keep", plan=plan_outputs, process=keep_shard, params=lambda p: {"batch_docs": p.filter.batch_docs}),
    ),
    suite="tasks.validation.filter",
    report=report,
    plot_files=plot_files,
    warnings=warnings,
    check=check_classifier_names,
    kept=("classifier", "aside"),  # dvc.yaml outs
    other_inputs=classifier_inputs,  # a model trained earlier
)
