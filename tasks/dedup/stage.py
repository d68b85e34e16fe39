"""Stage `dedup`: document-level deduplication across all datasets, as MT-NLG: exact duplicates of the
normalised text first, then MinHash LSH for a sparse document graph whose connected components are
duplicate groups, each keeping its document from the highest-priority dataset. Six declared passes:

  signatures  (sharded)  exact key, MinHash signature and shingle set per document (tasks.dedup.signing)
  exact       (global)   exact duplicates removed by priority (tasks.dedup.exact)
  buckets     (sharded)  per LSH band, the buckets of two or more documents (tasks.dedup.graph)
  components  (global)   candidates verified, connected components, representatives, the report
  aside       (sharded)  removed documents with the id of the document each duplicates
  remove      (sharded)  the kept documents: the stage's output (tasks.dedup.removal)
"""
from __future__ import annotations

from tasks.core.config import PipelineParams
from tasks.core.stage import GlobalPass, ShardedPass, Stage, absent_datasets
from tasks.decontaminate.ngram_index import HASH_VERSION
from tasks.dedup.exact import build_exact
from tasks.dedup.graph import bucket_shard, build_components, plan_buckets
from tasks.dedup.removal import aside_shard, plan_aside, plan_remove, remove_shard
from tasks.dedup.signing import plan_signatures, sign_shard

NAME = "dedup"
SIGNATURE_VERSION = 2  # part of the signature pass's fingerprint: change it when a hash or the layout changes (2: sig permutation-major)


def signature_params(p: PipelineParams) -> dict:
    d = p.dedup
    return {"version": SIGNATURE_VERSION, "normalisation": HASH_VERSION, "shingle": d.shingle, "ngram": d.ngram, "num_perm": d.num_perm,
            "seed": d.seed, "verify": d.verify}


def exact_params(p: PipelineParams) -> dict:
    return {"exact": p.dedup.exact, "priority": list(p.dedup.priority)}


def bucket_params(p: PipelineParams) -> dict:
    return {"lsh": list(p.dedup.lsh()), "band_shards": p.dedup.band_shards}


def component_params(p: PipelineParams) -> dict:
    d = p.dedup
    return {"verify": d.verify, "threshold": d.threshold, "max_centers": d.max_centers}


LOW_RECALL = 0.95  # under this chance of finding a pair at the threshold, the stage says so


def warnings(stats: dict, p: PipelineParams) -> list[str]:
    from tasks.dedup.lsh import candidate_probability, recall_bands
    d = p.dedup
    (bands, rows), said = d.lsh(), []
    found = candidate_probability(d.threshold, bands, rows)
    if found < LOW_RECALL:  # 20 x 6 suits 0.8: at threshold 0.5 it found 36% of the pairs at 0.52
        b, r = recall_bands(d.threshold, d.num_perm)
        said.append(f"dedup: {bands} bands x {rows} rows find a pair at the threshold {d.threshold} with probability "
                     f"{found:.0%}: {1 - found:.0%} of such near-duplicates are never compared; bands: {b}, rows: {r} "
                     f"find 99%")
    return said + absent_datasets("dedup.priority", d.priority, stats.get("dedup", {}).get("datasets", {}),
                                  "it ranks nothing")


STAGE = Stage(
    # dvc.yaml deps: its package and the code it imports (tests/test_layout.py checks it is all here)
    code=("tasks/dedup", "tasks/decontaminate/ngram_index.py", "tasks/evalsets", "kernels"),
    name=NAME, section="dedup", input=lambda p: p.dedup.input_stage,
    doc="Exact then fuzzy (MinHash LSH, connected components) dedup across datasets, keeping the highest-priority copy.",
    passes=(
        ShardedPass("signatures", plan=plan_signatures, process=sign_shard, params=signature_params),
        GlobalPass("exact", build=build_exact, params=exact_params),
        ShardedPass("buckets", plan=plan_buckets, process=bucket_shard, params=bucket_params),
        GlobalPass("components", build=build_components, params=component_params),
        # batch_docs sets the Parquet row groups: the same rows, other bytes
        ShardedPass("aside", plan=plan_aside, process=aside_shard, params=lambda p: {"batch_docs": p.dedup.batch_docs}),
        ShardedPass("remove", plan=plan_remove, process=remove_shard, params=lambda p: {"batch_docs": p.dedup.batch_docs}),
    ),
    suite="tasks.validation.dedup",
    warnings=warnings,
    kept=("aside",),  # dvc.yaml outs
)
