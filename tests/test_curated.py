"""Download's inputs as they come: curated dumps (The Pile's .jsonl.zst, Dolma's .json.gz, Hugging Face
Parquet, files of one name in many folders, truncated or mislabelled files, bad lines) and crawl listings
that list nothing usable."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tasks.core.config import parse_params
from tasks.core.errors import ConfigError, InputFileError
from tasks.core.runner import run_stage
from tasks.download.curated import CuratedFile, curated_shards, fixed_root, ingest_curated
from tests.conftest import REPO, copy_stages, small_raw

ROWS = [{"text": f"document {i} with some words é", "meta": {"pile_set_name": "Pile-CC" if i % 2 else "Books3"}}
        for i in range(5)]
JSONL = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


def ingest(path: Path, tmp: Path, dataset: str | None = None):
    (shard,) = curated_shards([(str(path), dataset, fixed_root(str(path)))])
    st = ingest_curated(path, tmp / f"{shard.name}.parquet", shard.tag)
    return st, pq.read_table(tmp / f"{shard.name}.parquet").to_pylist()


def test_every_format_gives_the_same_documents(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(JSONL)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(JSONL[:100]) + gzip.compress(JSONL[100:]))  # two members
    c = zstandard.ZstdCompressor()
    (tmp_path / "a.jsonl.zst").write_bytes(c.compress(JSONL[:70]) + c.compress(JSONL[70:]))  # two frames
    (tmp_path / "a.json.gz").write_bytes(gzip.compress(JSONL))  # Dolma's name for JSON lines
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")  # meta as a struct
    pq.write_table(pa.Table.from_pylist([{"text": r["text"], "meta": json.dumps(r["meta"])} for r in ROWS]),
                   tmp_path / "b.parquet")  # meta as a JSON string
    want = [(r["text"], r["meta"]["pile_set_name"]) for r in ROWS]
    for name in ("a.jsonl", "a.jsonl.gz", "a.jsonl.zst", "a.json.gz", "a.parquet", "b.parquet"):
        st, docs = ingest(tmp_path / name, tmp_path)
        assert [(d["text"], d["dataset"]) for d in docs] == want, name
        assert st.docs_in == 5 and st.docs_out == 5 and not st.dropped, name
        assert docs[1]["id"] == f"Pile-CC/{name}/1"


def test_files_of_one_name_in_several_folders_are_all_kept(tmp_path):
    for folder, n in (("a", 2), ("b", 3)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.jsonl").write_text("".join(json.dumps({"text": f"{folder} {i}"}) + "\n" for i in range(n)))
    raw = small_raw(tmp_path / "data", download={"curated": [{"path": str(tmp_path / "*" / "train.jsonl"), "dataset": "X"}]})
    p = parse_params(raw)
    run_stage("sample", p)
    run_stage("download", p)
    shards = tmp_path / "data/download/shards"
    a, b = (pq.read_table(shards / f"curated-{f}_train.parquet").to_pylist() for f in "ab")
    assert [d["text"] for d in a + b] == ["a 0", "a 1", "b 0", "b 1", "b 2"]
    assert [d["id"] for d in a + b] == ["X/a/train.jsonl/0", "X/a/train.jsonl/1", "X/b/train.jsonl/0",
                                        "X/b/train.jsonl/1", "X/b/train.jsonl/2"]
    assert (shards / "curated-wikipedia_en.parquet").is_file()  # the sample's own keep their names


def test_two_entries_with_files_of_one_name_are_named_under_their_common_folder(tmp_path):
    """Two Hugging Face datasets each hold data/train-00000-of-00001.parquet: both are ingested, under
    names and ids that say which dataset folder each came from; a third entry without a clash keeps
    its short name."""
    for ds in ("ds1", "ds2"):
        (tmp_path / "hf" / ds / "data").mkdir(parents=True)
        pq.write_table(pa.table({"text": [f"{ds} one", f"{ds} two"]}),
                       tmp_path / "hf" / ds / "data" / "train-00000-of-00001.parquet")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "books.jsonl").write_text(json.dumps({"text": "a book"}) + "\n")
    curated = [{"path": str(tmp_path / f"hf/{ds}/data/*.parquet"), "dataset": ds.upper()} for ds in ("ds1", "ds2")]
    curated.append({"path": str(tmp_path / "other/books.jsonl"), "dataset": "Books"})
    p = parse_params(small_raw(tmp_path / "data", download={"curated": curated}))
    run_stage("sample", p)
    assert "warnings" not in run_stage("download", p)  # every entry names its dataset
    shards = tmp_path / "data/download/shards"
    docs = {ds: pq.read_table(shards / f"curated-{ds}_data_train-00000-of-00001.parquet").to_pylist()
            for ds in ("ds1", "ds2")}
    assert [d["text"] for d in docs["ds1"] + docs["ds2"]] == ["ds1 one", "ds1 two", "ds2 one", "ds2 two"]
    assert [d["id"] for d in docs["ds2"]] == ["DS2/ds2/data/train-00000-of-00001.parquet/0",
                                              "DS2/ds2/data/train-00000-of-00001.parquet/1"]
    assert pq.read_table(shards / "curated-books.parquet").to_pylist()[0]["text"] == "a book"
    # without `dataset` and meta.pile_set_name each file is a dataset of its own: said in the warnings
    del curated[0]["dataset"]
    stats = run_stage("download", parse_params(small_raw(tmp_path / "data", download={"curated": curated})))
    assert stats["warnings"] == ["download.curated: 2 documents have no dataset name (their entry sets no `dataset`, "
                                 "their line no meta.pile_set_name): each is named after its file, so a dataset of "
                                 "many files became as many datasets; set the entry's dataset"]
    assert {d["dataset"] for d in pq.read_table(shards / "curated-ds1_data_train-00000-of-00001.parquet").to_pylist()} \
        == {"train-00000-of-00001"}
    # one file under two entries would be ingested twice: refused, naming both
    with pytest.raises(ConfigError, match=r"books.jsonl is listed twice \(also as .*books.jsonl\)"):
        curated_shards([(str(tmp_path / "other/books.jsonl"), None, str(tmp_path / "other")),
                        (str(tmp_path / "other/../other/books.jsonl"), "B", str(tmp_path))])


def test_unreadable_sources_are_refused_naming_the_file(tmp_path):
    (tmp_path / "d.jsonl").mkdir()
    (tmp_path / "x.txt").write_text("{}\n")
    for path, message in ((tmp_path / "d.jsonl", "is a directory"), (tmp_path / "x.txt", "unsupported format"),
                          (tmp_path / "nope.jsonl", "does not exist")):
        with pytest.raises(ConfigError, match=f"download.curated: {path}.*{message}"):
            curated_shards([(str(path), None, str(tmp_path))])
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b_c.jsonl").write_text("")
    (tmp_path / "a" / "b" / "c.jsonl").write_text("")
    with pytest.raises(ConfigError, match="would both be shard curated-b_c"):
        curated_shards([(str(tmp_path / "a/b_c.jsonl"), None, str(tmp_path / "a")),
                        (str(tmp_path / "a/b/c.jsonl"), None, str(tmp_path / "a"))])


def test_a_truncated_or_mislabelled_compressed_file_fails_naming_it(tmp_path):
    big = "".join(json.dumps({"text": f"row {i} " * 20}) + "\n" for i in range(3000)).encode()
    cases = {"cut.jsonl.zst": zstandard.ZstdCompressor().compress(big), "cut.jsonl.gz": gzip.compress(big)}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob[:int(len(blob) * 0.6)])
        with pytest.raises(InputFileError, match=f"{name}: truncated (zstd|gzip) stream"):
            ingest(tmp_path / name, tmp_path)
    (tmp_path / "plain.jsonl.zst").write_bytes(JSONL)
    with pytest.raises(InputFileError, match="plain.jsonl.zst: not a valid zstd stream"):
        ingest(tmp_path / "plain.jsonl.zst", tmp_path)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputFileError, match="junk.parquet: not a readable Parquet file"):
        ingest(tmp_path / "junk.parquet", tmp_path)


def test_text_field_reads_datasets_that_keep_text_under_another_key(tmp_path):
    """The Stack keeps its text in `content`: read with text_field, and refused naming the keys without
    it (not ingested as an empty shard of `missing_text` drops)."""
    rows = [{"content": "def f():\n    return 1\n", "lang": "Python"}, {"content": "int main() {}", "lang": "C"}]
    (tmp_path / "stack.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "stack.parquet")
    for name in ("stack.jsonl", "stack.parquet"):
        (shard,) = curated_shards([CuratedFile(str(tmp_path / name), "Github", str(tmp_path), "content")])
        st = ingest_curated(tmp_path / name, tmp_path / "out.parquet", shard.tag)
        assert [d["text"] for d in pq.read_table(tmp_path / "out.parquet").to_pylist()] == [r["content"] for r in rows]
        assert st.docs_out == 2 and not st.dropped
    with pytest.raises(InputFileError, match=r"stack.jsonl: no line has a 'text' key \(the first has 'content', "
                                             r"'lang'\): set the entry's text_field"):
        ingest(tmp_path / "stack.jsonl", tmp_path)
    with pytest.raises(InputFileError, match=r"stack.parquet: no 'text' column \(columns: content, lang\)"):
        ingest(tmp_path / "stack.parquet", tmp_path)
    # some lines without the key among good ones are counted, as before
    (tmp_path / "mixed.jsonl").write_text(json.dumps({"text": "kept"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    st, docs = ingest(tmp_path / "mixed.jsonl", tmp_path)
    assert [d["text"] for d in docs] == ["kept"] and st.dropped == {"missing_text": 1}


def test_bad_lines_are_counted_and_skipped(tmp_path):
    lines = [json.dumps({"text": "good one"}).encode(),
             b"{not json",
             b'{"text": "x", "n": ' + b"9" * 5000 + b"}",  # past Python's int digit limit
             b"[" * 200_000,  # nesting deeper than the recursion limit
             b'{"text": "lone \\ud800 surrogate"}',
             "{\"text\": \"caf\xe9 in latin-1\"}".encode("latin-1"),
             b'{"meta": {}}',
             b"",
             json.dumps({"text": "good two"}).encode()]
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(lines))
    st, docs = ingest(tmp_path / "bad.jsonl", tmp_path, "D")
    assert [d["text"] for d in docs] == ["good one", "lone \ufffd surrogate", "caf\ufffd in latin-1", "good two"]
    assert [d["id"] for d in docs] == ["D/bad.jsonl/0", "D/bad.jsonl/4", "D/bad.jsonl/5", "D/bad.jsonl/8"]
    assert dict(st.dropped) == {"malformed_json": 3, "missing_text": 1}
    assert st.docs_in == 8 and st.extra == {"surrogates_replaced": 1, "lines_not_utf8": 1}
    (tmp_path / "empty.jsonl.zst").write_bytes(b"")
    st, docs = ingest(tmp_path / "empty.jsonl.zst", tmp_path)
    assert docs == [] and st.extra == {"empty_files": 1}


# mtime=0 and ids: gzip stamps the time, and two test workers that collect a second apart must see the
# same test names (pytest-xdist refuses to run otherwise)
@pytest.mark.parametrize("listing,message", [(gzip.compress(b"\n", mtime=0), "lists no files"),
                                             (gzip.compress(b"\xff\xfe w\x00a\x00r\x00c\x00", mtime=0),
                                              "not a gzip list of paths"),
                                             # the file refused is named, not the listing's first (a valid one)
                                             (gzip.compress(b"a.warc.gz\nb.warc.gz\n\nc.warc.wet.gz\n", mtime=0),
                                              "lists 'c.warc.wet.gz': a Common Crawl WET")],
                         ids=["empty", "utf16", "wet-after-warcs"])
def test_a_crawl_listing_that_lists_nothing_usable_is_named(tmp_path, listing, message):
    from tasks.sample.server import StaticServer

    crawl = tmp_path / "www/crawl-data/CC-MAIN-2024-10"
    crawl.mkdir(parents=True)
    (crawl / "warc.paths.gz").write_bytes(listing)
    with StaticServer(tmp_path / "www") as url:
        p = parse_params(small_raw(tmp_path / "data", download={"source": "commoncrawl", "base_url": url,
                                                                "crawl_id": "CC-MAIN-2024-10", "retries": 0}))
        with pytest.raises(InputFileError, match=f"crawl-data/CC-MAIN-2024-10/warc.paths.gz: {message}"):
            run_stage("download", p)


def test_an_uncompressed_warc_in_a_crawl_listing_is_downloaded_and_extracted(tmp_path):
    """Planning and extract take a .warc; download checked every file as gzip, so each attempt was deleted as
    "truncated" and the file never came."""
    from tasks.sample.server import StaticServer

    crawl = tmp_path / "www/crawl-data/CC-MAIN-2024-10"
    crawl.mkdir(parents=True)
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<html><body><p>"
            + b"The quick brown fox jumps over the lazy dog near the river bank. " * 20 + b"</p></body></html>")
    record = (b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://a.example/\r\nWARC-Record-ID: <urn:uuid:1>\r\n"
              b"Content-Type: application/http; msgtype=response\r\nContent-Length: %d\r\n\r\n" % len(http))
    (crawl / "a.warc").write_bytes(record + http + b"\r\n\r\n")
    (crawl / "warc.paths.gz").write_bytes(gzip.compress(b"crawl-data/CC-MAIN-2024-10/a.warc\n", mtime=0))
    with StaticServer(tmp_path / "www") as url:
        p = parse_params(small_raw(tmp_path / "data", download={"source": "commoncrawl", "base_url": url, "n_files": 1,
                                                                "crawl_id": "CC-MAIN-2024-10", "retries": 1}))
        stats = run_stage("download", p)
    assert stats.get("failed_shards", []) == []
    assert (tmp_path / "data/download/shards/a.warc").read_bytes() == (crawl / "a.warc").read_bytes()
    assert run_stage("extract", p)["docs_out"] == 1


def test_a_double_star_in_a_curated_path_matches_files_at_any_depth(tmp_path):
    """glob without recursive=True reads `**` as `*`: one folder level, the others left out with no word."""
    from tasks.download.stage import users_curated

    for rel in ("top.jsonl", "a/one.jsonl", "a/b/two.jsonl"):
        (tmp_path / "corpus" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "corpus" / rel).write_text(json.dumps({"text": rel}) + "\n")
    p = parse_params(small_raw(tmp_path / "data", download={
        "curated": [{"path": str(tmp_path / "corpus/**/*.jsonl"), "dataset": "X"}]}))
    found = sorted(Path(c.path).relative_to(tmp_path / "corpus").as_posix() for c in users_curated(p))
    assert found == ["a/b/two.jsonl", "a/one.jsonl", "top.jsonl"]


def test_padding_a_byte_order_mark_and_a_file_that_is_not_json_lines(tmp_path):
    (tmp_path / "padded.jsonl.gz").write_bytes(gzip.compress(JSONL) + b"\x00" * 512)  # as gzip -d accepts
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + JSONL)
    for name in ("padded.jsonl.gz", "bom.jsonl"):
        st, docs = ingest(tmp_path / name, tmp_path)
        assert len(docs) == 5 and not st.dropped, name
    (tmp_path / "array.json.gz").write_bytes(gzip.compress(json.dumps(ROWS, indent=1).encode()))
    with pytest.raises(InputFileError, match="array.json.gz: no line is a JSON object .*not JSON lines"):
        ingest(tmp_path / "array.json.gz", tmp_path)


def gzip_member_of_size(data: bytes, size: int) -> bytes:
    """One gzip member of `data` exactly `size` bytes long: its header's comment takes up the difference."""
    import struct
    import zlib
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = c.compress(data) + c.flush()
    comment = size - 10 - 1 - len(deflated) - 8
    assert comment >= 0
    return (b"\x1f\x8b\x08\x10\x00\x00\x00\x00\x00\xff" + b"c" * comment + b"\x00" + deflated
            + struct.pack("<II", zlib.crc32(data), len(data)))


@pytest.mark.parametrize("ends_before_a_read_ends", [100, 0])
def test_zero_padding_that_runs_past_a_read_is_still_padding(tmp_path, ends_before_a_read_ends):
    """Padding was checked only in the read where the last member ends: its rest, in the next 1 MiB read (or all
    of it, when the member ended with a read), went to a new decompressor and failed as `incorrect header
    check`, though gzip -t accepts the file."""
    from tasks.download.curated import _CHUNK
    path = tmp_path / "padded.jsonl.gz"
    path.write_bytes(gzip_member_of_size(JSONL, _CHUNK - ends_before_a_read_ends) + b"\x00" * (10 << 10))
    assert subprocess.run(["gzip", "-t", str(path)], capture_output=True).returncode == 0
    st, docs = ingest(path, tmp_path)
    assert [d["text"] for d in docs] == [r["text"] for r in ROWS] and not st.dropped


def test_curated_files_named_in_other_scripts_are_told_apart(tmp_path):
    """Every character outside [A-Za-z0-9._-] becomes `_` in a shard's name: 中文.jsonl and 日本.jsonl were both
    shard curated-__, and the stage refused to start."""
    names = ("中文.jsonl", "日本.jsonl", "русский.jsonl", "ελληνικά.jsonl", "plain name.jsonl")
    for n in names:
        (tmp_path / n).write_text(json.dumps({"text": n}) + "\n")
    shards = curated_shards([(str(tmp_path / n), None, str(tmp_path)) for n in names])
    assert len({s.name for s in shards}) == len(names)
    assert shards[-1].name == "curated-plain_name"  # ASCII names keep the names they had
    assert all(re.fullmatch(r"curated-_+-[0-9a-f]{8}", s.name) for s in shards[:-1]), [s.name for s in shards]


def test_a_curated_corpus_copied_anew_is_not_converted_again(tmp_path, monkeypatch):
    """A corpus copied to a new disk has new mtimes; counted by them, download converted it all again.
    Large files are hashed once after such a change (SMALL_INPUT stands in for their size here)."""
    import os
    import time

    from tasks.core import identity
    monkeypatch.setattr(identity, "SMALL_INPUT", 16)
    pile = tmp_path / "pile" / "00.jsonl"
    pile.parent.mkdir()
    pile.write_bytes(JSONL)
    p = parse_params(small_raw(tmp_path / "data", download={"curated": [{"path": str(pile)}]}))
    run_stage("sample", p)

    def redone() -> int:
        st = run_stage("download", p)
        return 0 if st.get("up_to_date") else st["shards"] - st["resumed_shards"]

    assert redone() > 0
    later = time.time() + 100
    os.utime(pile, (later, later))
    assert redone() == 0
    pile.write_bytes(JSONL.replace(b"document 3", b"document 8"))  # same size, other text
    assert redone() == 1


def a_project_whose_download_warns(folder: Path) -> None:
    """params.yaml in `folder` with a curated file whose documents name no dataset (the download stage
    warns about it), and the sample stage run."""
    import yaml

    from tests.test_errors import cli
    (folder / "books.jsonl").write_text(json.dumps({"text": "a book about ships"}) + "\n")
    raw = small_raw(folder / "data", download={"curated": [{"path": str(folder / "books.jsonl")}]})
    (folder / "params.yaml").write_text(yaml.safe_dump(raw))
    assert cli(folder, "sample").returncode == 0


def a_failed_validation_planted(module: str, then: str) -> str:
    """A program that makes `module`'s validation_of fail every stage ('a planted failure'), then runs `then`."""
    return (f"import sys, {module} as m\n"
            "from tasks.core.errors import ExpectationFailed\n"
            "def fail(stage, *a, **k): raise ExpectationFailed(stage, ['a planted failure'], 'docs')\n"
            f"m.validation_of = fail\n{then}\n")


def test_the_command_prints_the_warnings_once_on_stderr(tmp_path):
    """The command prints a stage's warnings as the stage ends, before its validation (whose failure one
    may explain: they were printed only after a passed validation), and not again in its summary."""
    from tests.test_errors import cli
    a_project_whose_download_warns(tmp_path)
    failing = a_failed_validation_planted("tasks.validation", "from tasks.__main__ import main; sys.exit(main(['download']))")
    failed = subprocess.run([sys.executable, "-c", failing], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert failed.returncode == 3, failed.stderr  # the warning comes with the failure it may explain
    assert failed.stderr.splitlines()[0].startswith("warning: download.curated: 1 documents have no dataset name")
    assert "validation failed: stage 'download' failed validation: a planted failure" in failed.stderr
    out = cli(tmp_path, "download")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("warning: download.curated: 1 documents have no dataset name"), out.stderr
    assert "warnings" not in json.loads(out.stdout)  # printed once, on stderr


def test_a_download_setting_that_changes_no_file_redoes_no_shard(tmp_path, downloaded):
    """Every download setting was in each shard's fingerprint: a longer timeout, another retry count or one
    more curated file downloaded every WARC file again (at scale, 100 GB for a changed timeout)."""
    copy_stages(downloaded, tmp_path / "data")
    books = tmp_path / "books.jsonl"
    books.write_text(json.dumps({"text": "a book about ships"}) + "\n")
    for over, fetched in (({"timeout_s": 20, "retries": 4, "backoff_s": 0.02, "max_failed_fraction": 0.5}, 0),
                          ({"curated": [{"path": str(books), "dataset": "books"}]}, 1)):
        st = run_stage("download", parse_params(small_raw(tmp_path / "data", download=over)))
        assert not st.get("up_to_date") and st["shards"] - st["resumed_shards"] == fetched, over


def test_text_that_is_bytes_or_never_a_string_and_a_long_zstd_window(tmp_path):
    """A Parquet `text` column of type binary (Hive, Impala, old Spark) and JSON lines whose `text` is a list
    of paragraphs were ingested as 0 documents of `missing_text`, exit 0; a `zstd --long=31` file (2 GiB
    window: Pushshift dumps) was refused as not valid zstd."""
    pq.write_table(pa.table({"text": pa.array([r["text"].encode() for r in ROWS], pa.binary())}), tmp_path / "b.parquet")
    st, docs = ingest(tmp_path / "b.parquet", tmp_path, "hive")
    assert [d["text"] for d in docs] == [r["text"] for r in ROWS] and not st.dropped
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": [r["text"], "more"]}) + "\n" for r in ROWS))
    with pytest.raises(InputFileError, match=r"p.jsonl: no line's 'text' is text \(the first is a list\): set the "
                                             r"entry's text_field"):
        ingest(tmp_path / "p.jsonl", tmp_path)
    # as `zstd --long=31` writes a stream whose size it does not know (a pipe): the frame asks for 2 GiB
    long = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters.from_level(
        3, window_log=31, enable_ldm=True)).compressobj()
    (tmp_path / "l.jsonl.zst").write_bytes(long.compress(JSONL) + long.flush())
    st, docs = ingest(tmp_path / "l.jsonl.zst", tmp_path)
    assert [d["text"] for d in docs] == [r["text"] for r in ROWS] and st.docs_out == 5


def test_two_snapshots_are_downloaded_and_each_document_keeps_its_own(tmp_path):
    """MT-NLG blends CC-2020-50 and CC-2021-04: download.crawl_id took one snapshot, and extract stamped every
    document with it, so the mt-nlg blend's CC-2021-04 could never be made. Each WARC's warcinfo (isPartOf, as
    Common Crawl writes it) names its snapshot; n_files of each snapshot are fetched."""
    import random

    from tasks.sample.server import StaticServer
    from tasks.sample.warc_writer import WarcBuilder, http_response
    from tasks.tokenize.pieces import blend_names
    crawls = ["CC-MAIN-2020-50", "CC-MAIN-2021-04"]
    for k, crawl in enumerate(crawls):
        folder = tmp_path / "www/crawl-data" / crawl
        folder.mkdir(parents=True)
        rels = []
        for f in range(2):  # real names carry a timestamp, not the snapshot
            name = f"CC-MAIN-2020112{k}153826-{f:05d}.warc.gz"
            w = WarcBuilder(random.Random(f))
            w.warcinfo(name, crawl)
            w.page(f"https://a{k}.example/{f}", http_response(
                b"<html><body><p>" + f"Snapshot {crawl} page {f} tells of the harbour and its ships. ".encode() * 20
                + b"</p></body></html>"))
            (folder / name).write_bytes(w.getvalue())
            rels.append(f"crawl-data/{crawl}/segments/1/warc/{name}")
            (folder / "segments/1/warc").mkdir(parents=True, exist_ok=True)
            (folder / name).rename(folder / "segments/1/warc" / name)
        (folder / "warc.paths.gz").write_bytes(gzip.compress("\n".join(rels).encode(), mtime=0))
    with StaticServer(tmp_path / "www") as url:
        for given in (crawls[:1], crawls):  # the second snapshot added: the first's WARCs are not done again
            p = parse_params(small_raw(tmp_path / "data", download={
                "source": "commoncrawl", "base_url": url, "n_files": 1, "selection": "first", "crawl_id": given,
                "retries": 1}))
            fetched, extracted = run_stage("download", p), run_stage("extract", p)
            assert fetched["shards"] == extracted["shards"] == len(given)
            assert fetched["resumed_shards"] == extracted["resumed_shards"] == len(given) - 1
    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "data/extract/shards").glob("*.parquet")))
    assert sorted(zip(table.column("url").to_pylist(), table.column("crawl").to_pylist())) == [
        ("https://a0.example/0", "CC-MAIN-2020-50"), ("https://a1.example/0", "CC-MAIN-2021-04")]
    assert sorted(blend_names(table.combine_chunks().to_batches()[0]).to_pylist()) == ["CC-2020-50", "CC-2021-04"]
    with pytest.raises(ConfigError, match="a snapshot is listed twice: CC-MAIN-2020-50"):
        parse_params(small_raw(tmp_path / "data", download={"crawl_id": crawls + ["CC-MAIN-2020-50"]}))
    with pytest.raises(ConfigError, match="CC-MAIN-YYYY-WW, got 'CC-2021-04'"):
        parse_params(small_raw(tmp_path / "data", download={"crawl_id": ["CC-2021-04"]}))
