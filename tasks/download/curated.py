"""Curated datasets (The Pile's layout: one JSON object per line, `{"text": ..., "meta": {"pile_set_name":
...}}`; or Parquet with a `text` column) ingested into document shards, streamed.

Formats: .jsonl, .jsonl.gz, .jsonl.zst, .json.gz and .json.zst (JSON lines, as Dolma names them),
.parquet. Anything else is refused when the stage plans, not read as garbage. A compressed file that
ends inside its stream, or is no such stream, fails the stage naming the file: a partial dataset is
never ingested as if whole. A bad line is counted and skipped (malformed JSON, no text); a line that
is not UTF-8 is decoded with U+FFFD and counted, as are lone surrogates in the JSON (UTF-8 cannot hold them).

Each file is one shard, named by its path under the pattern's fixed directory (`/data/*/train.jsonl`
gives `a_train`, `b_train`), so files of the same name in different folders never overwrite each other;
entries whose files would share a name are named under the entries' common folder (`curated_shards`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from pathlib import Path
from typing import Iterator, NamedTuple

import pyarrow.parquet as pq
import zstandard

from tasks.core.errors import ConfigError, InputFileError
from tasks.core.passes import Shard, ShardStats
from tasks.core.schema import DocWriter
from tasks.download.http_fetch import safe_filename

JSON_LINES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst")
FORMATS = JSON_LINES + (".parquet",)
_MAGIC = re.compile(r"[*?[]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (UTF-8 cannot encode it). isascii() is O(1) and the C encoder
    ~5x faster than the regex on other text: the regex alone was a fifth of ingest time."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
_CHUNK = 1 << 20


def format_of(path: str) -> str | None:
    name = path.lower()
    return next((f for f in sorted(FORMATS, key=len, reverse=True) if name.endswith(f)), None)


def fixed_root(pattern: str) -> str:
    """The directory of a path or glob above its first wildcard: shard names are paths below it."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts[:-1]:
        if _MAGIC.search(part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."


class CuratedFile(NamedTuple):
    path: str
    dataset: str | None  # None: each row's meta.pile_set_name
    root: str  # the entry's fixed folder: the shard is named by the path below it
    text_field: str = "text"


def curated_shards(sources: list[tuple]) -> list[Shard]:
    """One shard per (file, dataset override, fixed root), named by the file's path under its root.

    Entries whose files would share a name (two Hugging Face datasets each with
    `data/train-00000-of-00001.parquet`) are named under the roots' common folder instead
    (`ds1_data_train-00000-of-00001`), every file of those entries alike. Refuses missing files,
    unknown formats, a file listed twice, and names that still collide (`a/b_c.jsonl`, `a/b/c.jsonl`)."""
    sources = [CuratedFile(*s) for s in sources]
    listed: dict[str, str] = {}
    for path, *_ in sources:
        if not Path(path).is_file():
            what = "is a directory, not a file" if Path(path).is_dir() else "does not exist"
            raise ConfigError(f"download.curated: {path} {what}")
        if format_of(path) is None:
            raise ConfigError(f"download.curated: {path}: unsupported format (expected {', '.join(FORMATS)})")
        real = os.path.realpath(path)
        if real in listed:
            raise ConfigError(f"download.curated: {path} is listed twice (also as {listed[real]}): it would be "
                              f"ingested twice")
        listed[real] = path
    roots = {s.root: s.root for s in sources}
    clashing = {r for group in _by_name(sources, roots).values() if len({r for _, r in group}) > 1
                for _, r in group}
    if clashing:
        common = os.path.commonpath([os.path.abspath(r) for r in clashing])
        roots.update(dict.fromkeys(clashing, common))
    by_path = {s.path: s for s in sources}
    shards = []
    for stem, group in _by_name(sources, roots).items():
        if len(group) > 1:
            raise ConfigError(f"download.curated: {group[0][0]} and {group[1][0]} would both be shard curated-{stem}")
        (path, root), = group
        tag = json.dumps({"dataset": by_path[path].dataset, "source": os.path.relpath(path, roots[root]),
                          "text_field": by_path[path].text_field}, sort_keys=True)
        shards.append(Shard(name=f"curated-{stem}", inputs=(path,), output=f"curated-{stem}.parquet", tag=tag))
    return shards


def _by_name(sources: list[CuratedFile], roots: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """Shard name -> [(file, its entry's root)], in the sources' order, with each root mapped by `roots`."""
    named: dict[str, list[tuple[str, str]]] = {}
    for path, _, root, _ in sources:
        source, fmt = os.path.relpath(path, roots[root]), format_of(path)
        name = source[:len(source) - len(fmt)].replace(os.sep, "_")
        stem = safe_filename(name)
        if not name.isascii():  # each character became `_`: 中文 and 日本 were both `__`, refused as one shard
            stem += "-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        named.setdefault(stem, []).append((path, root))
    return named


ZSTD_MAX_WINDOW = 1 << 31


def _decompressed(path: Path, fh, fmt: str) -> Iterator[bytes]:
    """The file's bytes, decompressed; every member/frame must end where its stream says."""
    if not fmt.endswith((".gz", ".zst")):
        yield from iter(lambda: fh.read(_CHUNK), b"")
        return
    gz = fmt.endswith(".gz")
    kind = "gzip" if gz else "zstd"
    # a window up to 2 GiB: `zstd --long=31` files (Pushshift dumps, Rust writers) were refused by the
    # default 128 MiB limit as "Frame requires too much memory for decoding"; memory follows the frame's own window
    new = (lambda: zlib.decompressobj(31)) if gz else \
        (lambda: zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj())
    d, inside, read, padded = new(), False, 0, False
    while block := fh.read(_CHUNK):
        read += len(block)
        if padded and not block.strip(b"\x00"):
            continue  # the padding goes on past a read (10 KiB of a tape block, say, across the 1 MiB reads)
        padded = False
        while block:
            try:
                out = d.decompress(block)
            except (zlib.error, zstandard.ZstdError) as e:
                raise InputFileError(f"{path}: not a valid {kind} stream at byte ~{read}: {e}") from None
            inside = True
            if out:
                yield out
            if not d.eof:
                break
            block, d, inside = d.unused_data, new(), False  # the next member / frame, if any
            if gz and not block.strip(b"\x00"):
                # zero padding after the last member (tape blocks, some writers): gzip ignores it; so is a next
                # read of zeros only (a member may also end exactly where a read does)
                block, padded = b"", True
    if inside:
        raise InputFileError(f"{path}: truncated {kind} stream: the file ends inside a {'member' if gz else 'frame'} "
                             f"after {read} bytes")


def _lines(path: Path, fmt: str) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        rest = bytearray()  # the line still open: extended in place, so a huge line is not re-copied per chunk
        first = True
        for chunk in _decompressed(path, fh, fmt):
            if first and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]  # a UTF-8 byte order mark
            first = False
            if b"\n" not in chunk:
                rest += chunk
                continue
            lines = chunk.split(b"\n")
            rest += lines[0]
            yield bytes(rest)
            yield from lines[1:-1]
            rest = bytearray(lines[-1])
        if rest:
            yield bytes(rest)


def _rows(path: Path, fmt: str, st: ShardStats, text_field: str) -> Iterator[tuple[int, object]]:
    """(index, parsed row) of every non-blank line or Parquet row; bad lines counted and skipped."""
    if fmt == ".parquet":
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a broken file
            raise InputFileError(f"{path}: not a readable Parquet file: {e}") from None
        names = pf.schema_arrow.names
        if text_field not in names:
            raise InputFileError(f"{path}: no {text_field!r} column (columns: {', '.join(names)}): set the "
                                 f"entry's text_field")
        i = 0
        for batch in pf.iter_batches(columns=list(dict.fromkeys(c for c in (text_field, "meta") if c in names)),
                                     batch_size=4096):
            for row in batch.to_pylist():
                text = row[text_field]
                st.docs_in += 1
                st.bytes_in += len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0
                yield i, row
                i += 1
        return
    for i, raw in enumerate(_lines(path, fmt)):
        if not raw.strip():
            continue
        st.docs_in += 1
        st.bytes_in += len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("utf-8", "replace")
            st.extra["lines_not_utf8"] = st.extra.get("lines_not_utf8", 0) + 1
        try:
            yield i, json.loads(line)
        except (ValueError, RecursionError):  # bad JSON, a number past int's digit limit, deep nesting
            st.drop("malformed_json")


def ingest_curated(path: Path, out: Path, tag: str) -> ShardStats:
    """One curated file -> a document shard. Ids are `<dataset>/<path under the fixed root>/<line>`."""
    meta_tag = json.loads(tag)
    dataset, source, field = meta_tag["dataset"], meta_tag["source"], meta_tag.get("text_field", "text")
    fmt = format_of(str(path))
    st = ShardStats()
    without_field, first_keys = 0, None  # objects that lack the key altogether: a wrong text_field
    not_text, first_type = 0, None  # a key whose value is never text (a list of paragraphs): the wrong key too
    with DocWriter(out) as w:
        for i, row in _rows(path, fmt, st, field):
            text = row.get(field) if isinstance(row, dict) else None
            if isinstance(row, dict) and field not in row:
                without_field += 1
                first_keys = first_keys or list(row)
            if isinstance(text, bytes):  # a Parquet binary column (Hive, Impala, old Spark: no UTF-8 annotation)
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError:
                    text = text.decode("utf-8", "replace")
                    st.extra["lines_not_utf8"] = st.extra.get("lines_not_utf8", 0) + 1
            elif text is not None and not isinstance(text, str):
                not_text += 1
                first_type = first_type or type(text).__name__
            if not isinstance(text, str) or not text.strip():
                st.drop("missing_text")
                continue
            if _has_surrogate(text):
                text = _SURROGATE.sub("\ufffd", text)
                st.extra["surrogates_replaced"] = st.extra.get("surrogates_replaced", 0) + 1
            meta = row.get("meta")
            if isinstance(meta, str):  # Parquet exports often keep meta as a JSON string
                try:
                    meta = json.loads(meta)
                except ValueError:
                    meta = None
            meta = meta if isinstance(meta, dict) else {}
            name = dataset or meta.get("pile_set_name")
            if not name:  # a Stage.warnings line: a dataset of many files becomes as many datasets
                name = path.name.split(".")[0]
                st.extra["docs_named_after_their_file"] = st.extra.get("docs_named_after_their_file", 0) + 1
            name = _SURROGATE.sub("\ufffd", str(name))
            w.write({"id": f"{name}/{source}/{i}", "text": text, "dataset": name, "url": "",
                     "crawl": "", "lang": "", "lang_score": 0.0})
    if st.docs_in == 0:
        st.extra["empty_files"] = 1
    elif st.docs_out == 0 and w.docs == 0 and st.dropped.get("malformed_json", 0) == st.docs_in:
        # not one line is JSON: another format under a JSON-lines name (a JSON array, pretty-printed JSON)
        raise InputFileError(f"{path}: no line is a JSON object ({st.docs_in} lines): not JSON lines")
    elif w.docs == 0 and without_field and without_field == st.docs_in - st.dropped.get("malformed_json", 0):
        raise InputFileError(f"{path}: no line has a {field!r} key (the first has {', '.join(map(repr, first_keys))}): "
                             f"set the entry's text_field")
    elif w.docs == 0 and not_text and not_text + without_field == st.docs_in - st.dropped.get("malformed_json", 0):
        raise InputFileError(f"{path}: no line's {field!r} is text (the first is a {first_type}): set the entry's "
                             f"text_field to a key that holds the document's text")
    st.docs_out, st.bytes_out = w.docs, w.text_bytes
    return st
