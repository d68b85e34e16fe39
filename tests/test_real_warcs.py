"""Real web archives: old WARC versions, LF-only headers, wrong lengths, chunked and compressed
bodies, bracketed URIs, language labels; each quirk asserted by its counted reason and its text."""
from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from tasks.core.config import parse_params
from tasks.core.passes import Shard
from tasks.core.stage import Context
from tasks.extract.stage import process
from tasks.extract.warc_reader import iter_warc
from tests import warc_fixtures as fx
from tests.conftest import REPO, small_raw


def extract(tmp_path: Path, name: str, data: bytes, **over):
    (tmp_path / name).write_bytes(data)
    p = parse_params(small_raw(tmp_path / "data", extract={"lang_min_chars": 100, **over}))
    out = tmp_path / f"{name}.parquet"
    st = process(Shard(name, (str(tmp_path / name),), out.name), out, p, Context("extract", str(tmp_path)))
    assert st.docs_in == st.docs_out + sum(st.dropped.values())  # one entry per record
    return st, pq.read_table(out).to_pylist()


def test_clueweb09_warc_018_lf_only_wrong_lengths(tmp_path):
    data, html, texts = fx.clueweb09(5)
    st, docs = extract(tmp_path, "cw09.warc.gz", data)
    assert st.docs_out == html == 5 and st.docs_in == 6  # warcinfo + 5 responses
    assert st.dropped == {"record_warcinfo": 1}
    assert st.extra["content_length_mismatch"] == 6
    assert [d["url"] for d in docs] == [f"http://site{i}.example.com/" for i in range(5)]
    for d, text in zip(docs, texts):
        assert text in d["text"] and "WARC/0.18" not in d["text"] and "HTTP/1.1" not in d["text"]


def test_content_codings_as_warcio_and_browsers_read_them():
    """A review against warcio's content_stream: values that name no coding dropped plain pages; "gzip, gzip" on
    a body gzipped once returned the still-gzipped input; zstd was not decoded; brotli had no bomb limit (1.6 KB
    became 1 GiB) and a br body cut by the crawler was dropped where cut gzip and deflate ones are kept."""
    import gzip

    import brotli
    import zstandard

    from tasks.extract.http_body import MAX_DECODED, decode_content
    page = b"<html><body><p>" + b"The parish council met on Tuesday. " * 200 + b"</p></body></html>"
    for value in ("UTF-8", "text/html", "binary"):
        assert decode_content(page, value) == (page, "encoding_header_plain_body"), value
    assert decode_content(gzip.compress(page, mtime=0), "gzip, gzip") == (page, "content_decoded")
    assert decode_content(zstandard.ZstdCompressor().compress(page), "zstd") == (page, "content_decoded")
    rng = random.Random(1)
    varied = b"<html><body><p>" + b" ".join(rng.choice([b"parish", b"council", b"met", b"on", b"Tuesday", b"road"])
                                             for _ in range(3000)) + b"</p></body></html>"
    whole = brotli.compress(varied)
    cut, outcome = decode_content(whole[:len(whole) * 2 // 3], "br")
    assert outcome == "content_decoded" and varied.startswith(cut) and len(cut) > len(varied) // 2
    bomb = brotli.compress(b"<p>" + b"\0" * (MAX_DECODED * 2), quality=1)
    out, outcome = decode_content(bomb, "br")
    assert outcome == "content_decoded" and len(out) == MAX_DECODED
    assert decode_content(b"\x8b\x02\x80" + bytes(range(256)) * 4, "gzip, x-compress")[1] == "content_undecodable"


def test_a_whole_file_gzip_larger_than_a_record_may_be_is_read_record_by_record(tmp_path, monkeypatch):
    """ClueWeb09's files are one gzip stream of ~1 GB: read as one member, a file past MAX_MEMBER lost every
    record (a review with fastwarc, which streams them). Here with the limits scaled down 256 times."""
    from tasks.extract import warc_reader
    monkeypatch.setattr(warc_reader, "MAX_MEMBER", 1 << 20)
    monkeypatch.setattr(warc_reader, "STREAM_AT", 1 << 18, raising=False)
    data, n, texts = fx.clueweb09(1500)  # ~1.2 MB uncompressed
    assert len(gzip.decompress(data)) > 1 << 20
    records = list(iter_warc_bytes(tmp_path, data))
    assert [r for r in records if isinstance(r, str)] == []
    responses = [r for r in records if r.type == "response"]
    assert [r.target_uri for r in responses] == [f"http://site{i}.example.com/" for i in range(n)]
    assert all(t.encode() in r.payload for r, t in zip(responses, texts))


def iter_warc_bytes(tmp_path: Path, data: bytes):
    (tmp_path / "whole.warc.gz").write_bytes(data)
    return iter_warc(tmp_path / "whole.warc.gz")


def test_heritrix_warc_017_and_bracketed_uri(tmp_path):
    data, html, texts = fx.heritrix_2008(4)
    st, docs = extract(tmp_path, "iah.warc.gz", data)
    assert st.docs_out == html and st.dropped == {"record_request": 4}
    assert docs[0]["url"] == "http://www.archive.example/0.html"  # brackets stripped
    assert all(t in d["text"] for d, t in zip(docs, texts))


def test_chunked_and_content_encoded_bodies(tmp_path):
    data, n, texts, counts = fx.encodings()
    st, docs = extract(tmp_path, "enc.warc.gz", data)
    assert {k: st.extra.get(k, 0) for k in counts} == counts
    assert st.dropped == {"content_undecodable": 1}
    assert st.docs_out == n - 1
    by_url = {d["url"]: d["text"] for d in docs}
    for i, text in zip([0, 1, 3, 4, 5, 6, 7, 8], texts):
        got = by_url[f"https://enc.example.org/{i}"]
        assert text in got, (i, got[:200])
        assert "7d72" not in got and not got.rstrip().endswith("\n0")
    assert "7d72" in by_url["https://enc.example.org/2"]  # broken framing: the raw body, counted


def test_chinese_japanese_korean_pages_are_named_and_a_short_page_is_unknown(tmp_path):
    data, expected = fx.languages()
    _, docs = extract(tmp_path, "lang.warc.gz", data)
    got = {d["url"]: d["lang"] for d in docs}
    assert got == expected
    assert all(0.0 <= d["lang_score"] <= 1.0 for d in docs)


def test_a_content_length_too_large_reads_the_same_in_every_gzip_layout(tmp_path):
    """A writer that over-counts Content-Length by 40 bytes: the record ends where the next one
    starts, or where its own gzip member ends (Common Crawl's layout, one member per record); the
    same pages either way. An uncompressed file that ends inside a record is a cut, dropped."""
    http = [fx.http_response(fx.page(i)[0]) for i in range(3)]
    recs = [fx.record_bytes("response", f"https://cl.example/{i}", h, date="2020-01-01T00:00:00Z",
                            rng=random.Random(i), content_type="application/http; msgtype=response")
            for i, h in enumerate(http)]
    over = b"Content-Length: %d\r\n" % (len(http[2]) + 40)
    recs[2] = recs[2].replace(b"Content-Length: %d\r\n" % len(http[2]), over)
    assert over in recs[2]
    layouts = {"member.warc.gz": b"".join(fx.gz(r) for r in recs), "stream.warc.gz": gzip.compress(b"".join(recs)),
               "plain.warc": b"".join(recs)}
    got = {}
    for name, data in layouts.items():
        st, docs = extract(tmp_path, name, data)
        got[name] = [(d["url"], d["text"]) for d in docs]
        if name == "plain.warc":
            assert st.dropped == {"truncated_record": 1}
        else:
            assert st.extra["content_length_mismatch"] == 1 and not st.dropped
    assert got["member.warc.gz"] == got["stream.warc.gz"] and len(got["member.warc.gz"]) == 3
    assert got["plain.warc"] == got["member.warc.gz"][:2]


def test_truncated_tail_and_empty_file_are_counted(tmp_path):
    st, docs = extract(tmp_path, "tail.warc.gz", fx.broken_tail())
    assert st.docs_out == 1 and sum(st.dropped.values()) == 1
    empty = gzip.compress(b"", mtime=0)
    st, docs = extract(tmp_path, "empty.warc.gz", empty)
    assert docs == [] and st.extra == {"empty_input": 1}


def test_reader_resyncs_after_a_malformed_record():
    good = fx.record_bytes("response", "https://a.example/", fx.http_response(fx.page(0)[0]),
                           date="2020-01-01T00:00:00Z", rng=fx.random.Random(0),
                           content_type="application/http; msgtype=response")
    bad = b"WARC/1.0\r\nWARC-Type: response\r\nContent-Length: nope\r\n\r\nbody\r\n\r\n"
    data = good + bad + good
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"resync-{os.getpid()}.warc"
    path.write_bytes(data)
    try:
        got = [r if isinstance(r, str) else r.type for r in iter_warc(path)]
    finally:
        path.unlink()
    assert got == ["response", "malformed_record", "response"]


def cli(root: Path, stage: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks", stage], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_failed_remote_files_are_skipped_listed_and_bounded(tmp_path):
    raw = small_raw(tmp_path / "data", sample={"n_warc_files": 4}, download={"n_files": 4, "retries": 1})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert cli(tmp_path, "sample").returncode == 0
    warcs = sorted((tmp_path / "data/sample/corpus").rglob("*.warc.gz"))
    warcs[1].unlink()  # 404
    warcs[2].write_bytes(warcs[2].read_bytes()[:-100])  # truncated on every retry
    out = cli(tmp_path, "download")  # default bound 1%: 2 of 4 WARC files is too many
    assert out.returncode == 1
    line = out.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("stage failed: stage 'download': 2 of 4 shards failed (at most 1.0% may)")
    assert "HTTP 404" in line[0] and "truncated or corrupt" in line[0]

    # the bound is a fraction of the remote files: the 2 curated files of the sample, which are never
    # gone, counted too (2 of 6 shards passed a bound of 40%)
    raw["download"]["max_failed_fraction"] = 0.4
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    out = cli(tmp_path, "download")
    assert out.returncode == 1 and "2 of 4 shards failed (at most 40.0% may)" in out.stderr, out.stderr

    raw["download"]["max_failed_fraction"] = 0.5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    out = cli(tmp_path, "download")
    assert out.returncode == 0, out.stderr
    stats = json.loads((tmp_path / "data/download/stats.json").read_text())
    assert [Path(f["file"]).name for f in stats["failed_files"]] == [warcs[1].name, warcs[2].name]
    assert stats["dropped"] == {"shard_failed": 2}
    assert sorted(f.name for f in (tmp_path / "data/download/shards").glob("*.warc.gz")) == [warcs[0].name, warcs[3].name]
    assert cli(tmp_path, "extract").returncode == 0


def test_wet_listing_is_refused_and_empty_output_fails_validation(tmp_path):
    raw = small_raw(tmp_path / "data")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert cli(tmp_path, "sample").returncode == 0
    listing = next((tmp_path / "data/sample/corpus").rglob("warc.paths.gz"))
    names = gzip.decompress(listing.read_bytes()).decode().split()
    listing.write_bytes(gzip.compress("\n".join(n.replace(".warc.gz", ".warc.wet.gz") for n in names).encode()))
    out = cli(tmp_path, "download")
    assert out.returncode == 2
    assert "a Common Crawl WET (extracted text) file; extract reads WARC files" in out.stderr.strip().splitlines()[-1]

    # an extract stage whose input yields no document at all fails its expectation suite
    shards = tmp_path / "data/download/shards"
    shards.mkdir(parents=True, exist_ok=True)
    (shards / "empty.warc.gz").write_bytes(gzip.compress(b"", mtime=0))
    from tasks.core.runner import adopt_outputs

    adopt_outputs(parse_params(raw), "download")
    out = cli(tmp_path, "extract")
    assert out.returncode == 3, out.stderr
    assert "expect_table_row_count_to_be_between" in out.stderr
    stats = json.loads((tmp_path / "data/extract/stats.json").read_text())
    assert stats["extra"]["empty_input"] == 1 and stats["validation"]["success"] is False
