"""Stage `extract`: WARC responses -> main text -> language ID -> document shards.

Per WARC shard: every record is either a document or a drop counted under its reason, so
docs_in == docs_out + sum(dropped). Curated shards from `download` pass through language ID.
Only the extraction library's call runs in a child process with a per-document time limit
(tasks.extract.sandbox), so one pathological page cannot stall a shard; charset repair and language ID are
linear-time and run here, overlapping the child's work on the previous pages.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from tasks.core.config import PipelineParams
from tasks.core.errors import InputFileError
from tasks.core.passes import Shard, ShardStats
from tasks.core.schema import CRAWL_DATASET, DocWriter, iter_docs
from tasks.core.stage import Context, ShardedPass, Stage, fixed, input_shard_files
from tasks.extract.html_text import finished, to_utf8
from tasks.extract.http_body import decode_content, dechunk, gunzip_unlabelled, has_binary_signature, looks_binary
from tasks.extract.langid import detect_lang
from tasks.extract.sandbox import TIMED_OUT, worker_for
from tasks.extract.warc_reader import Record, iter_warc, not_warc, parse_http
HTML_TYPES = ("text/html", "application/xhtml+xml")


# a WARC names its snapshot in its warcinfo record (Common Crawl's: `isPartOf: CC-MAIN-2020-50`): with two
# snapshots downloaded, it says which of them each document came from
_IS_PART_OF = re.compile(rb"(?mi)^isPartOf:[ \t]*(CC-MAIN-\d{4}-\d{2})[ \t]*\r?$")


# part of the pass's fingerprint: change it when the same WARC can give other documents (2: a record's
# Content-Length past its own gzip member's end is read to that end, no longer dropped as truncated)
READER_VERSION = 2
# likewise for the language-ID model (before: resiliparse's n-gram profiles)
LANGID_MODEL = "fasttext-lid.176.ftz"


def stage_params(p: PipelineParams) -> dict:
    return {**p.extract.model_dump(mode="json"), "reader_version": READER_VERSION, "langid_model": LANGID_MODEL}


def named_snapshot(path: Path) -> str | None:
    """The snapshot a WARC's first record, its warcinfo, names (isPartOf); None if it names none."""
    for rec in iter_warc(path):
        if isinstance(rec, Record) and rec.type == "warcinfo" and (named := _IS_PART_OF.search(rec.payload)):
            return named.group(1).decode()
        return None
    return None


def snapshot_of(path: Path, p: PipelineParams) -> str:
    """A WARC's snapshot: the one its warcinfo names, else the one snapshot downloaded, else "" (several). A
    shard's tag, so its fingerprint holds its own snapshot alone: with the list in the pass's parameters, a
    second snapshot added re-extracted every WARC of the first."""
    crawls = p.crawl_ids()
    return named_snapshot(path) or (crawls[0] if len(crawls) == 1 else "")


def plan(p: PipelineParams, ctx: Context) -> list[Shard]:
    shards = []
    for f in input_shard_files(ctx):
        refused = not_warc(f.name)
        if refused:
            raise InputFileError(f"{f}: {refused}")
        if f.name.endswith(".parquet"):
            shards.append(Shard(name=f.stem, inputs=(str(f),), output=f.name))
        else:
            stem = f.name.removesuffix(".gz").removesuffix(".warc")
            shards.append(Shard(name=stem, inputs=(str(f),), output=f"{stem}.parquet", tag=snapshot_of(f, p)))
    return shards


def _charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v:
            return v.strip("\"' ").lower()
    return None


def language(text: str, p: PipelineParams) -> tuple[str, float]:
    e = p.extract
    return detect_lang(text, e.lang_chars, e.lang_min_chars, e.lang_min_confidence)


def _count(st: ShardStats, key: str) -> None:
    st.extra[key] = st.extra.get(key, 0) + 1


def _html_body(rec: Record, p: PipelineParams, st: ShardStats) -> tuple[bytes, str] | None:
    """The HTML body of a response record as the server meant it (de-chunked, decompressed), with
    its declared content type; None after counting why there is none."""
    try:
        status, headers, body = parse_http(rec.payload)
    except ValueError:
        st.drop("malformed_http")
        return None
    ctype = headers.get("content-type", "")
    if status != 200:
        st.drop("http_not_200")
        return None
    if ctype.split(";")[0].strip().lower() not in HTML_TYPES:
        st.drop("not_html")
        return None
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body, outcome = dechunk(body)
        _count(st, outcome)
    encoding = headers.get("content-encoding", "")
    if encoding:
        body, outcome = decode_content(body, encoding)
        _count(st, outcome)
        if body is None:
            st.drop("content_undecodable")
            return None
    elif (unzipped := gunzip_unlabelled(body)) is not None:
        body = unzipped
        _count(st, "gzip_body_without_header")
    if not body.strip():
        st.drop("empty_body")
    elif len(body) > p.extract.max_html_bytes:
        st.drop("too_large")
    else:
        return body, ctype
    return None


def _candidates(path: Path, p: PipelineParams, st: ShardStats, meta: list, crawl: str) -> Iterator[tuple]:
    """Filter WARC records down to HTML bodies worth extracting; count every drop. `meta` gets each one's
    (record index, URL, repaired, snapshot): `crawl` (snapshot_of), or what a later warcinfo names."""
    for i, rec in enumerate(iter_warc(path)):
        st.docs_in += 1
        if isinstance(rec, str):
            st.drop(rec)
            continue
        st.bytes_in += len(rec.payload)
        if rec.type == "warcinfo" and (named := _IS_PART_OF.search(rec.payload)):
            crawl = named.group(1).decode()
        if rec.repaired:
            _count(st, rec.repaired)
        reason = _skip_reason(rec)
        if reason:
            st.drop(reason)
            continue
        found = _html_body(rec, p, st)
        if found is not None:
            if has_binary_signature(found[0]):  # a PDF, an image, an archive served as text/html
                st.drop("binary_body")
                continue
            body, repaired = to_utf8(found[0], _charset(found[1]))
            if looks_binary(body):  # random or compressed bytes served as text/html
                st.drop("binary_body")
                continue
            meta.append((i, rec.target_uri, repaired, crawl))
            yield body, p.extract.extractor
    if st.docs_in == 0:
        _count(st, "empty_input")  # a WARC file with no record at all (e.g. an empty .warc.gz)


def _skip_reason(rec: Record) -> str | None:
    kind = rec.type
    if kind != "response":
        return f"record_{kind or 'untyped'}"
    if "application/http" not in rec.header("content-type", "application/http"):
        return "not_http"
    return None


def _extract_warc(shard: Shard, tmp: Path, p: PipelineParams) -> ShardStats:
    st, meta = ShardStats(), []
    path = Path(shard.inputs[0])
    crawl = shard.tag or snapshot_of(path, p)  # (a shard planned elsewhere, without the tag)
    worker = worker_for("tasks.extract.html_text:extract_main_text")
    with DocWriter(tmp) as w:
        for k, (ok, text) in enumerate(worker.map(_candidates(path, p, st, meta, crawl), p.extract.time_limit_s)):
            rec_index, url, repaired, crawl = meta[k]
            if repaired:
                st.extra["encoding_repaired"] = st.extra.get("encoding_repaired", 0) + 1
            if not ok:
                st.drop("extract_timeout" if text is TIMED_OUT else "extract_error")
                continue
            text = finished(text)
            if len(text) < max(1, p.extract.min_text_chars):
                st.drop("empty_text")
                continue
            lang, score = language(text, p)
            _count(st, f"lang.{lang}")
            w.write({"id": f"{CRAWL_DATASET}/{shard.name}/{rec_index}", "text": text, "dataset": CRAWL_DATASET,
                     "url": url, "crawl": crawl, "lang": lang, "lang_score": score})
            if not crawl:  # several snapshots downloaded and a WARC without isPartOf: blended as common-crawl
                st.extra["crawl_unnamed"] = st.extra.get("crawl_unnamed", 0) + 1
    st.docs_out, st.bytes_out = w.docs, w.text_bytes
    return st


def _langid_curated(shard: Shard, tmp: Path, p: PipelineParams) -> ShardStats:
    st = ShardStats()
    with DocWriter(tmp) as w:
        for doc in iter_docs(Path(shard.inputs[0])):
            st.docs_in += 1
            st.bytes_in += len(doc["text"].encode("utf-8"))
            doc["lang"], doc["lang_score"] = language(doc["text"], p)
            _count(st, f"lang.{doc['lang']}")
            w.write(doc)
    st.docs_out, st.bytes_out = w.docs, w.text_bytes
    return st


def process(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    if shard.inputs[0].endswith(".parquet"):
        return _langid_curated(shard, tmp, p)
    return _extract_warc(shard, tmp, p)


STAGE = Stage(
    code=("tasks/extract",),  # dvc.yaml deps
    name="extract", section="extract", input=fixed("download"),
    doc="WARC -> main text + language ID -> Parquet document shards.",
    passes=(ShardedPass("extract", plan=plan, process=process, params=stage_params),),
    suite="tasks.validation.extract",
)
