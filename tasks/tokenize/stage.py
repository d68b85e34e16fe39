"""Stage `tokenize`: what the trainer reads, as four declared passes.
  tokenizer (global)  byte-level BPE trained on the input's text (streamed), or the user's file(s)
  tokens    (sharded) each input shard encoded into a piece of (dataset, tokens) rows
  datasets  (global)  the pieces merged into one Megatron .bin/.idx dataset per `dataset` value
  blend     (global)  MT-NLG's weighted blend: document, sample and shuffle indices per dataset and
                      the blend index (identical choices to megatron-core's)
"""
from __future__ import annotations

import json
import re
from itertools import islice
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq

from tasks.core.config import PipelineParams
from tasks.core.stage import Context, GlobalPass, ShardedPass, Stage, input_files
from tasks.tokenize import tokenizer
from tasks.tokenize.blend import build_blend
from tasks.tokenize.pieces import merge_datasets, plan_tokens, tokenize_shard

NAME = "tokenize"


# BPE training rescans a pre-token on every merge: one run of 400,000 letters (a DNA sequence, a base64 blob,
# in a dataset the filters exempt) took the trainer from 0.3 s to 48 s, growing as its square. The text it
# learns from is broken every 256 non-space characters; what is encoded later is never changed.
_LONG_RUN = re.compile(r"(\S{256})(?=\S)")


def _text_batches(shards: list[Path], batch_docs: int, max_docs: int) -> Iterator[list[str]]:
    seen = 0
    for shard in shards:
        for batch in pq.ParquetFile(shard).iter_batches(batch_size=batch_docs, columns=["text"]):
            texts = batch.column("text").to_pylist()
            if max_docs:
                texts = list(islice(texts, max(0, max_docs - seen)))
            seen += len(texts)
            if texts:
                yield [_LONG_RUN.sub(r"\1 ", t) for t in texts]
            if max_docs and seen >= max_docs:
                return


def build_tokenizer(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    t = p.tokenize
    if t.tokenizer_file:
        tok = tokenizer.load(Path(t.tokenizer_file), Path(t.merges_file) if t.merges_file else None)
        source = "file"
    else:
        shards = input_files(ctx)
        tok = tokenizer.train(_text_batches(shards, t.batch_docs, t.train_max_docs), t.vocab_size, t.min_frequency)
        source = "trained"
    tok.save(str(tmp / "tokenizer.json"))
    report = {"source": source, "vocab_size": tokenizer.id_bound(tok), "eod_id": tokenizer.eod_id(tok)}
    (tmp / "tokenizer_report.json").write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
    return report


def _tokenizer_params(p: PipelineParams) -> dict:
    t = p.tokenize
    return {"file": t.tokenizer_file, "merges": t.merges_file, "vocab_size": t.vocab_size,
            "min_frequency": t.min_frequency, "train_max_docs": t.train_max_docs}


def _user_tokenizer(p: PipelineParams, ctx: Context) -> list[str]:
    t = p.tokenize
    return [t.tokenizer_file] + ([t.merges_file] if t.merges_file else []) if t.tokenizer_file else []


def _check_user_tokenizer(p: PipelineParams, ctx: Context) -> None:
    """A user's tokenizer loads (the stage's declared check: refused before its last results go)."""
    t = p.tokenize
    if t.tokenizer_file:
        tokenizer.load(Path(t.tokenizer_file), Path(t.merges_file) if t.merges_file else None)


def _tokenizer_inputs(p: PipelineParams, ctx: Context) -> list[str]:
    """A user's files, or the input shards the tokenizer is trained on (their content is fingerprinted)."""
    return _user_tokenizer(p, ctx) or [str(f) for f in input_files(ctx)]


def _blend_params(p: PipelineParams) -> dict:
    t = p.tokenize
    return {"seq_length": t.seq_length, "train_tokens": t.train_tokens, "seed": t.seed, "profile": t.profile,
            "blend": [b.model_dump() for b in t.blend]}


STAGE = Stage(
    code=("tasks/tokenize",),  # dvc.yaml deps
    name=NAME, section="tokenize", input=lambda p: p.tokenize.input_stage,
    doc="Byte-level BPE, Megatron .bin/.idx datasets and MT-NLG's weighted blend.",
    passes=(
        GlobalPass("tokenizer", build=build_tokenizer, params=_tokenizer_params, inputs=_tokenizer_inputs),
        ShardedPass("tokens", plan=plan_tokens, process=tokenize_shard,
                    params=lambda p: {"batch_docs": p.tokenize.batch_docs}),
        GlobalPass("datasets", build=merge_datasets, params=lambda p: {}),
        GlobalPass("blend", build=build_blend, params=_blend_params),
    ),
    suite="tasks.validation.tokenize",
    kept=("tokenizer", "datasets"),  # dvc.yaml outs: what train reads
    other_inputs=_user_tokenizer,
    check=_check_user_tokenizer,
)
