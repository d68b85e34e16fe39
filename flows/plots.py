"""The distributions a person would rather see than read, as small PNG bar charts. They are
embedded in the stages' markdown artifacts as data URIs, so they show inside the Prefect UI with
no file server (checked in Chromium in both of Prefect's UIs, V2 and V1)."""
from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402


def bar_png(title: str, counts: dict[str, float], xlabel: str = "") -> bytes:
    """A horizontal bar chart, largest first (at most 20 bars; the rest summed as "other")."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(items) > 20:
        items = items[:19] + [("other", sum(v for _, v in items[19:]))]
    labels, values = [k for k, _ in items][::-1], [v for _, v in items][::-1]
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(items) + 1.2), dpi=90)
    ax.barh(labels, values, color="#3b82f6")
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    fractional = any(v != int(v) for v in values) and max(values, default=0) < 100
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.2f}" if fractional else f" {v:,.0f}", va="center", fontsize=8)
    ax.margins(x=0.15)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})  # no version string: same bytes each run
    plt.close(fig)
    return buf.getvalue()


def shares_png(title: str, rows: dict[str, dict]) -> bytes:
    """Target vs realised share per dataset, side by side (the blend's report)."""
    names = sorted(rows, key=lambda n: -rows[n]["target_share"])[:20][::-1]
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(names) + 1.2), dpi=90)
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], [rows[n]["target_share"] for n in names], height=0.4, color="#94a3b8",
            label="target")
    ax.barh([i - 0.2 for i in y], [rows[n]["realised_share"] for n in names], height=0.4, color="#3b82f6",
            label="realised")
    ax.set_yticks(list(y), names)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("share of training samples")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def heatmap_png(title: str, matrix: dict[str, dict[str, int]], names: list[str]) -> bytes:
    """Counts of a dataset x dataset matrix (dedup: row = the removed copy's dataset, column = the
    kept document's), each cell labelled."""
    names = names[:20]
    values = [[matrix.get(a, {}).get(b, 0) for b in names] for a in names]
    side = 0.55 * len(names) + 2.2
    fig, ax = plt.subplots(figsize=(side + 1.5, side), dpi=90)
    im = ax.imshow(values, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("kept document's dataset")
    ax.set_ylabel("removed copy's dataset")
    top = max((v for row in values for v in row), default=0)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:,}", ha="center", va="center", fontsize=8, color="white" if v > top / 2 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(title, fontsize=11)
    return _png(fig)


def histogram_png(title: str, counts: dict[str, list[int]]) -> bytes:
    """Per dataset, documents per score bin over [0, 1] (the filter's quality scores), as step lines."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=90)
    for name, c in sorted(counts.items())[:10]:
        edges = [i / len(c) for i in range(len(c) + 1)]
        ax.stairs(c, edges, label=name, linewidth=1.5)
    ax.set_xlabel("quality score")
    ax.set_ylabel("documents")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=7)
    return _png(fig)


def curve_png(title: str, points: list[list[float]], ylabel: str) -> bytes:
    """A line chart of (x, y) points (the training loss per step)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=90)
    ax.plot([x for x, _ in points], [y for _, y in points], color="#3b82f6", linewidth=1.2)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _png(fig) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def accuracy_png(title: str, accuracy: dict[str, dict[str, float]]) -> bytes:
    """Accuracy per task, one bar per shot setting (MT-NLG Figure 3's layout)."""
    tasks = sorted(accuracy)
    groups = [s for s in ("zero-shot", "one-shot", "few-shot") if any(s in row for row in accuracy.values())]
    fig, ax = plt.subplots(figsize=(7.2, 3.4), dpi=90)
    width = 0.8 / max(len(groups), 1)
    for g, name in enumerate(groups):
        values = [accuracy[t].get(name, 0) for t in tasks]
        ax.bar([i + (g - (len(groups) - 1) / 2) * width for i in range(len(tasks))], values, width=width, label=name)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8)
    return _png(fig)


def history_png(title: str, series: dict[str, list[tuple[float, float]]]) -> bytes:
    """Each task's accuracy against training tokens, across the evaluated checkpoints."""
    fig, ax = plt.subplots(figsize=(7.2, 3.6), dpi=90)
    for task, points in sorted(series.items()):
        points = sorted(points)
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3, linewidth=1.2, label=task)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=7, ncol=3)
    return _png(fig)


def stage_plots(stats: dict) -> list[tuple[str, bytes]]:
    """The charts a stage's stats.json supports: kept vs dropped by reason, languages, per-task
    matches, the sample's kinds of page."""
    out = []
    if "docs_out" in stats:
        kept = {"kept": stats["docs_out"], **{f"dropped: {k}": v for k, v in stats.get("dropped", {}).items()}}
        out.append(("Documents kept and dropped", bar_png(f"{stats['stage']}: kept and dropped", kept, "documents")))
    langs = {k.split(".", 1)[1]: v for k, v in stats.get("extra", {}).items() if k.startswith("lang.")}
    if langs:
        out.append(("Languages", bar_png(f"{stats['stage']}: languages", langs, "documents")))
    tasks = {t: row.get("training_docs_matched", 0) for t, row in stats.get("tasks", {}).items()}
    if tasks:
        out.append(("Documents matched per task", bar_png("training documents matched per task", tasks, "documents")))
    if isinstance(stats.get("blend"), dict) and stats["blend"]:
        out.append(("Blend: target vs realised share", shares_png("blend: target vs realised share", stats["blend"])))
        epochs = {name: row["epochs"] for name, row in stats["blend"].items()}
        out.append(("Epochs per dataset", bar_png("epochs per dataset", epochs, "epochs")))
    if isinstance(stats.get("dedup"), dict) and stats["dedup"].get("datasets"):
        d = stats["dedup"]
        removed = {n: r["exact_removed"] + r["fuzzy_removed"] for n, r in d["datasets"].items()}
        out.append(("Duplicates removed per dataset", bar_png("dedup: documents removed per dataset", removed, "documents")))
        out.append(("Whose copies were removed in favour of whose",
                    heatmap_png("dedup: removed (rows) in favour of kept (columns)", d["removed_in_favour_of"],
                                sorted(d["datasets"]))))
    if isinstance(stats.get("filter"), dict) and stats["filter"].get("score_histogram"):
        out.append(("Quality scores per dataset", histogram_png("filter: classifier scores per dataset",
                                                                stats["filter"]["score_histogram"])))
    if stats.get("loss_curve"):
        out.append(("Training loss", curve_png("train: loss per step", stats["loss_curve"], "loss")))
    if isinstance(stats.get("accuracy"), dict) and stats["accuracy"]:
        out.append(("Accuracy per task", accuracy_png("evaluate: accuracy per task", stats["accuracy"])))
    if isinstance(stats.get("kinds"), dict):
        out.append(("Sample pages by kind", bar_png("sample: pages by kind", stats["kinds"], "pages")))
    return out


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
