"""Stage `download`: Common Crawl WARC files over HTTP(S) + local curated Pile-style datasets.

Shards: one per WARC file (output: the verified .warc.gz) and one per curated file (output: a
Parquet shard in the document schema, `lang` still empty; tasks.download.curated). In sample mode the built-in sample
(data/sample/corpus) is served on 127.0.0.1 and downloaded through the same HTTP code as real data.
"""
from __future__ import annotations

import contextlib
import glob
import gzip
import random
from pathlib import Path
from typing import Iterator


from tasks.core.config import PipelineParams
from tasks.core.errors import InputFileError
from tasks.extract.warc_reader import not_warc
from tasks.core.passes import Shard, ShardFailed, ShardStats
from tasks.core.stage import Context, ShardedPass, Stage
from tasks.download.curated import CuratedFile, curated_shards, fixed_root, ingest_curated
from tasks.download.http_fetch import DownloadError, RetryPolicy, UnsafePathError, fetch, fetch_bytes, safe_filename, safe_url
from tasks.sample.generate import curated_files
from tasks.sample.server import StaticServer
from tasks.sample.stage import STAGE as SAMPLE


def fetch_params(p: PipelineParams) -> dict:
    """What one fetched or ingested file's bytes depend on besides the shard's own inputs and tag (the
    listed path, and in sample mode the served file; a curated file, its dataset and text field): the
    server. Retries, timeouts, how many files and which change no file's bytes: in the fingerprint, one
    more file or a longer timeout downloaded every WARC again (the stage's key still holds the section)."""
    return {"source": p.download.source, "base_url": p.download.base_url if p.download.source == "commoncrawl" else ""}


def policy(p: PipelineParams) -> RetryPolicy:
    d = p.download
    return RetryPolicy(d.retries, d.backoff_s, d.backoff_max_s, d.timeout_s)


@contextlib.contextmanager
def environment(p: PipelineParams) -> Iterator[dict]:
    """Where to download from. Sample mode serves the sample corpus on loopback for the stage's duration."""
    if p.download.source == "sample":
        root = SAMPLE.outputs(p.paths.data_dir)
        with StaticServer(root) as url:
            yield {"base_url": url, "served_root": str(root)}
    else:
        yield {"base_url": p.download.base_url}


def select(paths: list[str], n: int, how: str, seed: int) -> list[str]:
    if how == "first" or n >= len(paths):
        return paths[:n]
    keep = sorted(random.Random(seed).sample(range(len(paths)), n))  # listing order kept
    return [paths[i] for i in keep]


def listed(p: PipelineParams, ctx: Context, crawl: str) -> list[str]:
    """The WARC paths of one snapshot's `warc.paths.gz`."""
    listing = f"crawl-data/{crawl}/warc.paths.gz"
    raw = fetch_bytes(safe_url(ctx.env["base_url"], listing), policy(p), ctx.root / ".tmp-warc.paths.gz.part")
    try:
        paths = [ln.strip() for ln in gzip.decompress(raw).decode("utf-8").splitlines() if ln.strip()]
    except (OSError, EOFError, UnicodeDecodeError) as e:  # not gzip, cut short, not text
        raise InputFileError(f"{listing}: not a gzip list of paths ({type(e).__name__}: {e})") from None
    if not paths:
        raise InputFileError(f"{listing}: lists no files")
    refused = next(((x, why) for x in paths if (why := not_warc(x.rsplit("/", 1)[-1]))), None)
    if refused:  # named: the first path was another one, and a valid one
        raise InputFileError(f"{listing}: lists {refused[0].rsplit('/', 1)[-1]!r}: {refused[1]}")
    return select(paths, p.download.n_files, p.download.selection, p.download.seed)


def plan(p: PipelineParams, ctx: Context) -> list[Shard]:
    rt = ctx.env
    shards, names = [], set()
    for rel in [rel for crawl in p.crawl_ids() for rel in listed(p, ctx, crawl)]:  # n_files of each snapshot
        safe_url(rt["base_url"], rel)  # reject unsafe listings before any transfer starts
        name = safe_filename(rel)
        if name in names:
            raise UnsafePathError(f"two listed paths map to the same file name {name!r}")
        names.add(name)
        # In sample mode the served file is local: listing it makes a regenerated sample redo the shard.
        local = rt.get("served_root")
        inputs = (rel, str(Path(local) / rel)) if local else (rel,)
        shards.append(Shard(name=f"warc-{name}", inputs=inputs, output=name))
    sources = [(str(f), None, str(f.parent)) for f in curated_files(SAMPLE.outputs(p.paths.data_dir))] \
        if p.download.source == "sample" else []
    return shards + curated_shards(sources + users_curated(p))


def users_curated(p: PipelineParams) -> list[CuratedFile]:
    """The files of `download.curated` (a glob matching nothing stands for itself: refused as missing)."""
    sources = []
    for c in p.download.curated:
        matches = sorted(glob.glob(c.path, recursive=True)) or [c.path]  # `**`: any depth, as in a shell with globstar
        sources += [CuratedFile(m, c.dataset, fixed_root(c.path), c.text_field) for m in matches]
    return sources


def process(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    if shard.name.startswith("curated-"):
        return ingest_curated(Path(shard.inputs[0]), tmp, shard.tag)
    try:
        # a listed .warc is stored uncompressed (extract reads both): checked as gzip, every attempt was "truncated"
        rep = fetch(safe_url(ctx.env["base_url"], shard.inputs[0]), tmp, policy(p),
                    verify_gzip=shard.inputs[0].endswith(".gz"))
    except DownloadError as e:  # gone or still broken after retries: skip it, list it, go on
        raise ShardFailed(str(e)) from None
    st = ShardStats(docs_in=1, docs_out=1, bytes_in=rep.bytes, bytes_out=rep.bytes)
    st.extra = {"http_attempts": rep.attempts, "range_resumes": rep.range_resumes,
                "truncated_gzip_restarts": rep.restarts_truncated_gzip, "unverified_end": int(rep.unverified_end)}
    return st


def warnings(stats: dict, p: PipelineParams) -> list[str]:
    n = stats.get("extra", {}).get("docs_named_after_their_file", 0)
    return [f"download.curated: {n:,} documents have no dataset name (their entry sets no `dataset`, their line no "
            f"meta.pile_set_name): each is named after its file, so a dataset of many files became as many "
            f"datasets; set the entry's dataset"] if n else []


STAGE = Stage(
    # dvc.yaml deps: its package and the code it imports (tests/test_layout.py checks it is all here)
    code=("tasks/download", "tasks/sample", "tasks/evalsets", "tasks/extract/warc_reader.py"),
    name="download", section="download",
    input=lambda p: SAMPLE.name if p.download.source == "sample" else None,
    doc="Download WARC files (Common Crawl or the served sample) and ingest curated datasets.",
    passes=(ShardedPass("fetch", plan=plan, process=process, params=fetch_params,
                        max_failed=lambda p: p.download.max_failed_fraction,
                        fallible=lambda shard: not shard.name.startswith("curated-")),),
    report=lambda stats: {"failed_files": [{"file": f["inputs"][0], "reason": f["reason"]}
                                           for f in stats.get("failed_shards", [])]},
    suite="tasks.validation.download",
    environment=environment,
    input_is_remote=True,
    warnings=warnings,
    other_inputs=lambda p, ctx: [c.path for c in users_curated(p)],
    check=lambda p, ctx: curated_shards(users_curated(p)),  # a missing, unknown or twice-listed file
)
