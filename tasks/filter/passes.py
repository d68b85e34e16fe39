"""The passes of stage `filter` (declared in tasks.filter.stage):

  rules       (sharded)  every document with the first rule it fails ("" if none), C4's line edits applied
  classifier  (global)   the quality model: trained on curated vs raw crawl, or the one named in model_path
  score       (sharded)  quality scores of the documents the rules kept, and GPT-3's Pareto draw for the crawl
  aside       (sharded)  the dropped documents, with reason and score (data/filter/aside/shards/)
  keep        (sharded)  the kept documents: the stage's output, with per-dataset counts and score histograms
"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core.config import PipelineParams
from tasks.core.errors import ConfigError
from tasks.core.passes import Shard, ShardStats, finished_stats, savez
from tasks.core.schema import DOC_SCHEMA, DocWriter, iter_batches, text_bytes
from tasks.core.stage import Context, input_files, shard_per_file
from tasks.filter.classifier import QualityModel, pareto_keep, train, unit
from tasks.filter.rules import apply_rules, reason_names

RULED_SCHEMA = DOC_SCHEMA.append(pa.field("reason", pa.string()))
ASIDE_SCHEMA = RULED_SCHEMA.append(pa.field("score", pa.float32()))
BINS = 20  # score histogram bins over [0, 1]


def plan_rules(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(input_files(ctx))


def rules_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    f, st = p.filter, ShardStats()
    names = reason_names(f)
    with pq.ParquetWriter(tmp, RULED_SCHEMA, compression="zstd", write_statistics=False) as w:
        for batch in iter_batches(Path(shard.inputs[0]), None, f.batch_docs):
            table = pa.Table.from_batches([batch]).select(DOC_SCHEMA.names).cast(DOC_SCHEMA)
            table = table.set_column(1, "text", pc.fill_null(table.column("text"), ""))
            st.docs_in += table.num_rows
            st.bytes_in += text_bytes(table)
            reason, edited, removed = apply_rules(table, f)
            st.extra["c4_lines_removed"] = st.extra.get("c4_lines_removed", 0) + removed
            if any(e is not None for e in edited):
                texts = table.column("text").to_pylist()
                table = table.set_column(1, "text", pa.array([e if e is not None else t for e, t in zip(edited, texts)]))
            for r in np.flatnonzero(reason):
                st.drop(names[reason[r]])
            w.write_table(table.append_column("reason", pa.array([names[r] for r in reason], pa.string())))
            st.docs_out += int((reason == 0).sum())
    return st


def _present(seen) -> str:
    return f"(datasets present: {', '.join(sorted(seen)) or 'none'})"


def check_classifier_names(p: PipelineParams, ctx: Context) -> None:
    """The stage's declared check: a model trained earlier that does not load, or a class of the
    classifier's training data none of whose datasets is in the input, is refused before the rules pass,
    not after it. Some names absent is allowed (one params file for runs with and without a curated
    set): the stage's warnings name them. Reads the `dataset` column only (dictionary-encoded: small)."""
    c = p.filter.classifier
    if c.enabled and c.model_path:  # a model trained earlier: it loads
        QualityModel.load(c.model_path)
    if not c.enabled or c.model_path:
        return
    seen: set[str] = set()
    for f in input_files(ctx):
        seen.update(v for v in pc.unique(pq.read_table(f, columns=["dataset"]).column("dataset")).to_pylist() if v)
    for key, names in (("positives", c.positives), ("negatives", c.negatives)):
        if names and not any(n in seen for n in names):
            raise ConfigError(f"filter.classifier.{key}: none of {', '.join(map(repr, names))} is a dataset of the "
                              f"data {_present(seen)}")


def _ruled(ctx: Context) -> list[Path]:
    return sorted((ctx.pass_dir("rules") / "shards").glob("*.parquet"))


def _training_docs(p: PipelineParams, ctx: Context) -> dict[str, list[str]]:
    """Positives: the curated datasets' documents the rules kept; negatives: every raw crawl document.
    At most max_train_docs per class, chosen by a hash of the id (the same whatever the sharding)."""
    c = p.filter.classifier
    picks: dict[str, list[tuple[float, str, bool]]] = {"pos": [], "neg": []}
    seen: set[str] = set()
    dropped: Counter[str] = Counter()  # the rules' reasons for the positives' documents they dropped
    for f in _ruled(ctx):
        t = pq.read_table(f, columns=["id", "dataset", "reason"])
        ids, ds, reason = t.column("id").to_pylist(), t.column("dataset").to_pylist(), t.column("reason").to_pylist()
        seen.update(ds)
        rank, hold = unit(c.seed, ids, "train"), unit(c.seed, ids, "holdout")
        for i in range(len(ids)):
            if ds[i] in c.positives and reason[i]:
                dropped[reason[i]] += 1
            cls = "pos" if ds[i] in c.positives and not reason[i] else "neg" if ds[i] in c.negatives else None
            if cls:
                picks[cls].append((rank[i], ids[i], float(hold[i])))
    for cls, names in (("pos", c.positives), ("neg", c.negatives)):
        if not picks[cls]:
            raise ConfigError(f"filter.classifier: no {'positive' if cls == 'pos' else 'negative'} documents: "
                              f"{', '.join(names) or '(none listed)'} "
                              + ("are all dropped by the rules (" + ", ".join(f"{r}: {n:,}" for r, n in dropped.most_common(3))
                                 + ")" if cls == "pos" and dropped else _present(seen)))
    chosen = {i: (cls, h, k) for cls in picks
              for k, (i, h) in enumerate(split_heldout(cls, picks[cls], c.max_train_docs, c.holdout))}
    found: dict[str, list[tuple[int, str]]] = {"pos": [], "neg": [], "held_pos": [], "held_neg": [], "held_neg_scored": []}
    for f in _ruled(ctx):
        t = pq.read_table(f, columns=["id", "text", "reason"])
        for i, text, why in zip(t.column("id").to_pylist(), t.column("text").to_pylist(), t.column("reason").to_pylist()):
            if i in chosen:
                cls, held, k = chosen[i]
                found[("held_" if held else "") + cls].append((k, text))
                if held and cls == "neg" and not why:  # a crawl page the rules kept: what the classifier scores
                    found["held_neg_scored"].append((k, text))
    # in the order of the id hashes, not of the shards: the fit's floating point follows its rows' order, so
    # another sharding of the same documents gave another model (coefficients 2e-7 apart, most scores changed)
    return {key: [text for _, text in sorted(rows)] for key, rows in found.items()}


def split_heldout(cls: str, picks: list[tuple[float, str, float]], max_docs: int, holdout: float) -> list[tuple[str, bool]]:
    """A class's documents for the classifier, (id, held out): the first max_docs by their rank hash; held out
    where their holdout hash is below `holdout`, but never none nor all of them: without a held-out positive
    the Elkan-Noto scale is never measured (raw probabilities went to the Pareto rule, keeping almost no
    crawl), and without a training one the fit has one class."""
    chosen = sorted(picks)[:max_docs]
    name = "positive" if cls == "pos" else "negative"
    if len(chosen) < 2:
        raise ConfigError(f"filter.classifier: 1 {name} document, the classifier needs two (one to train on, "
                          f"one held out for the calibration and the AUC)")
    us = [u for _, _, u in chosen]
    held = [u < holdout for u in us]
    if not any(held):
        held[us.index(min(us))] = True
    elif all(held):
        held[us.index(max(us))] = False
    return [(i, h) for (_, i, _), h in zip(chosen, held)]


def build_classifier(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    c = p.filter.classifier
    if not c.enabled:
        return {"classifier": "disabled"}
    if c.model_path:
        model = QualityModel.load(c.model_path)
        shutil.copyfile(c.model_path, tmp / "model.npz")
        return {"classifier": "loaded", "classifier_auc": model.meta.get("heldout_auc"),
                "classifier_auc_scored": model.meta.get("heldout_auc_scored"), "classifier_scale": model.scale}
    docs = _training_docs(p, ctx)
    model, report = train(docs["pos"], docs["neg"], docs["held_pos"], docs["held_neg"], c, docs["held_neg_scored"])
    model.save(tmp / "model.npz")
    return {"classifier": "trained", **report}


def classifier_inputs(p: PipelineParams, ctx: Context) -> list[str]:
    c = p.filter.classifier
    return [c.model_path] if c.enabled and c.model_path else []


def plan_scores(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(_ruled(ctx), ".npz")


def score_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    """Scores (NaN: not scored) and the keep decision of each document, in row order."""
    c, st = p.filter.classifier, ShardStats()
    t = pq.read_table(shard.inputs[0], columns=["id", "text", "dataset", "reason"])
    n = t.num_rows
    score = np.full(n, np.nan, dtype=np.float32)
    keep = np.array([not r for r in t.column("reason").to_pylist()], dtype=bool)
    if c.enabled and n:
        model = QualityModel.load(ctx.pass_dir("classifier") / "model.npz")
        rows = np.flatnonzero(keep)
        texts = t.column("text").to_pylist()
        for lo in range(0, len(rows), p.filter.batch_docs):
            part = rows[lo:lo + p.filter.batch_docs]
            score[part] = model.score([texts[i] for i in part])
        ds = np.array(t.column("dataset").to_pylist(), dtype=object)
        sampled = rows[np.isin(ds[rows], list(c.negatives))]
        ids = t.column("id").to_pylist()
        draw = unit(c.seed, [ids[i] for i in sampled], "pareto")
        keep[sampled] = pareto_keep(score[sampled].astype(np.float64), draw, c.alpha)
        st.docs_out = len(rows)
    st.docs_in = n
    with open(tmp, "wb") as fh:
        savez(fh, score=score, keep=keep)
    return st


def _decisions(shard: Shard, ctx: Context) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    table = pq.read_table(ctx.pass_dir("rules") / "shards" / shard.output.replace(".npz", ".parquet"))
    with np.load(ctx.pass_dir("score") / "shards" / f"{shard.name}.npz", allow_pickle=False) as z:
        score, keep = z["score"], z["keep"]
    if len(score) != table.num_rows:
        raise ValueError(f"filter: shard {shard.name} has {table.num_rows} documents, its scores {len(score)}")
    reasons = np.array(table.column("reason").to_pylist(), dtype=object)
    reasons[(reasons == "") & ~keep] = "classifier"
    return table, reasons, score


def plan_outputs(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(_ruled(ctx))


def aside_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    table, reasons, score = _decisions(shard, ctx)
    rows = np.flatnonzero(reasons != "")
    out = table.take(pa.array(rows)).set_column(7, "reason", pa.array(reasons[rows].tolist(), pa.string()))
    out = out.append_column("score", pa.array(score[rows], pa.float32(), mask=np.isnan(score[rows])))
    pq.write_table(out.cast(ASIDE_SCHEMA), tmp, compression="zstd", write_statistics=False,
                   row_group_size=p.filter.batch_docs)
    return ShardStats(docs_in=table.num_rows, docs_out=len(rows), bytes_out=text_bytes(out))


def keep_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    """The kept documents; its stats carry, per dataset, the counts by reason and the score histogram."""
    table, reasons, score = _decisions(shard, ctx)
    st = ShardStats(docs_in=table.num_rows)
    ds = table.column("dataset").to_pylist()
    for i, r in enumerate(reasons):
        key = f"filter.ds|{ds[i]}|{r or 'kept'}"
        st.extra[key] = st.extra.get(key, 0) + 1
        if r:
            st.drop(r)
        if not np.isnan(score[i]):
            b = min(int(score[i] * BINS), BINS - 1)
            key = f"filter.hist|{ds[i]}|{b:02d}"
            st.extra[key] = st.extra.get(key, 0) + 1
    kept = table.filter(pa.array(reasons == "")).drop_columns(["reason"])
    with DocWriter(tmp, rows_per_group=p.filter.batch_docs) as w:
        w.write_table(kept)
    st.docs_out, st.bytes_out = w.docs, w.text_bytes
    st.bytes_in = finished_stats(ctx.pass_dir("rules"), shard.name)["bytes_in"]  # the input's, before C4's edits
    return st
