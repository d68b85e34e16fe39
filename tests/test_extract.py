"""Extraction: main text from real HTML, and every kind of bad input counted under its reason."""
from __future__ import annotations

import contextlib
import gzip
import os
import random
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.core.config import parse_params
from tasks.core import stopping
from tasks.core.stage import Context
from tasks.extract.stage import process
from tasks.extract.sandbox import TIMED_OUT, TimeLimitedWorker
from tasks.core.passes import Shard
from tasks.sample.warc_writer import WarcBuilder, gz, http_response, record_bytes
from tests.conftest import small_raw

ARTICLE = ("<html><body><nav><a href='/'>Home</a> | <a href='/news'>News</a></nav><main><article>"
           "<h1>River report</h1><p>The river delta changed slowly over many years while the survey team "
           "recorded the sediment near the old bridge of the northern valley.</p></article></main>"
           "<footer>Copyright 2020 Example Media. All rights reserved.</footer></body></html>")


def nasty_warc(path: Path) -> None:
    rng = random.Random(7)
    w = WarcBuilder(rng)
    w.warcinfo("nasty.warc.gz")
    w.page("https://ok.example/1", http_response(ARTICLE.encode()))
    w.page("https://latin.example/", http_response(ARTICLE.replace("river", "rivière").encode("latin-1"),
                                                   "text/html; charset=iso-8859-1"))
    w.page("https://mislabelled.example/", http_response(ARTICLE.replace("river", "café").encode("cp1252")))
    w.page("https://unknown-charset.example/", http_response(ARTICLE.encode(), "text/html; charset=x-klingon"))
    w.page("https://utf8-as-latin1.example/", http_response(ARTICLE.replace("river", "café").encode(),
                                                           "text/html; charset=iso-8859-1"))
    w.page("https://gzipped.example/", http_response(gzip.compress(ARTICLE.encode(), mtime=0)))  # no Content-Encoding
    noise = random.Random(3)
    w.page("https://pdf.example/", http_response(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n" + noise.randbytes(3000)))
    w.page("https://random.example/", http_response(noise.randbytes(5000)))
    w.page("https://empty.example/", http_response(b""))
    w.page("https://img.example/a.png", http_response(b"\x89PNG....", "image/png"))
    w.page("https://gone.example/", http_response(b"<html>gone</html>", status="404 Not Found"))
    w.add("response", "https://nohttp.example/", b"this is not an HTTP response", "application/http; msgtype=response")
    w.add("revisit", "https://ok.example/1", b"HTTP/1.1 304 Not Modified\r\n\r\n", "application/http; msgtype=response")
    old = record_bytes("response", "https://old.example/", http_response(ARTICLE.encode()), date="2008-01-01",
                       rng=rng, content_type="application/http; msgtype=response", version="WARC/0.18")
    w.parts.append(gz(old))
    w.parts.append(gz(b"WARC/1.0\r\nWARC-Type: response\r\nContent-Length: lots\r\n\r\nxx\r\n\r\n"))
    w.parts.append(gz(b"GARBAGE NOT WARC\r\n\r\n"))
    good_after = gz(record_bytes("response", "https://ok.example/2", http_response(ARTICLE.encode()),
                                 date="2020", rng=rng, content_type="application/http; msgtype=response"))
    corrupt = bytearray(gz(record_bytes("response", "https://corrupt.example/", http_response(ARTICLE.encode() * 5),
                                        date="2020", rng=rng)))
    corrupt[40:60] = b"\x00" * 20
    w.parts += [bytes(corrupt), good_after]
    tail = gz(record_bytes("response", "https://cut.example/", http_response(ARTICLE.encode()), date="2020", rng=rng))
    path.write_bytes(w.getvalue() + tail[: len(tail) // 2])


def test_bad_inputs_are_counted_and_skipped(tmp_path):
    nasty_warc(tmp_path / "nasty.warc.gz")
    p = parse_params(small_raw(tmp_path / "data", extract={"lang_min_chars": 100}))  # the pages are short
    st = process(Shard("nasty", (str(tmp_path / "nasty.warc.gz"),), "nasty.parquet"), tmp_path / "out.parquet", p, Context("extract", str(tmp_path)))
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    urls = [r["url"] for r in rows]
    assert urls == ["https://ok.example/1", "https://latin.example/", "https://mislabelled.example/",
                    "https://unknown-charset.example/", "https://utf8-as-latin1.example/", "https://gzipped.example/",
                    "https://old.example/", "https://ok.example/2"]
    assert "rivière" in rows[1]["text"] and "café" in rows[2]["text"] and "café" in rows[4]["text"]
    assert "sediment near the old bridge" in rows[5]["text"]
    assert all("Copyright" not in r["text"] and "Home" not in r["text"] for r in rows)  # boilerplate gone
    assert st.dropped == {
        "record_warcinfo": 1, "record_request": 11, "record_metadata": 11, "record_revisit": 1,
        "empty_body": 1, "not_html": 1, "http_not_200": 1, "malformed_http": 1, "binary_body": 2,
        "malformed_record": 2, "corrupt_gzip": 1, "truncated_gzip": 1,
    }
    assert st.extra["encoding_repaired"] == 3 and st.extra["gzip_body_without_header"] == 1
    assert st.docs_in == st.docs_out + sum(st.dropped.values())
    assert all(r["lang"] == "en" and r["id"].startswith("common-crawl/nasty/") for r in rows)
    assert {r["crawl"] for r in rows} == {"CC-MAIN-2020-50"}  # from the configuration, not the file name


def test_empty_and_garbage_files_do_not_crash(tmp_path):
    p = parse_params(small_raw(tmp_path / "data"))
    for name, data in [("empty.warc.gz", b""), ("junk.warc.gz", b"\x1f\x8b\x08" + b"\xff" * 500),
                       ("plain.warc", b"not a warc at all")]:
        (tmp_path / name).write_bytes(data)
        st = process(Shard(name, (str(tmp_path / name),), "o.parquet"), tmp_path / f"{name}.parquet", p, Context("extract", str(tmp_path)))
        assert st.docs_out == 0 and st.docs_in == sum(st.dropped.values())


def test_per_document_time_limit_in_stage(tmp_path):
    nasty_warc(tmp_path / "n.warc.gz")
    p = parse_params(small_raw(tmp_path / "data", extract={"time_limit_s": 1e-6}))
    st = process(Shard("n", (str(tmp_path / "n.warc.gz"),), "n.parquet"), tmp_path / "o.parquet", p, Context("extract", str(tmp_path)))
    assert st.dropped["extract_timeout"] >= 1
    assert st.docs_in == st.docs_out + sum(st.dropped.values())


def test_sandbox_kills_a_hung_item_and_continues():
    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_hang")
    try:
        # a limit the quick items never come near on a loaded machine (each timeout is a restart, counted)
        out = list(w.map(["a", "hang", "b", "boom", "c"], time_limit=3.0))
    finally:
        w.close()
    assert out[0] == (True, "A") and out[1] == (False, TIMED_OUT) and out[2] == (True, "B")
    assert out[3][0] is False and "bad item" in out[3][1] and out[4] == (True, "C")
    assert w.restarts == 1


def test_a_child_that_dies_mid_item_is_counted_as_a_crash_and_the_rest_go_on():
    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_die")
    try:
        out = list(w.map(["a", "die", "b", "c"], time_limit=30.0))
    finally:
        w.close()
    assert out == [(True, "A"), (False, "worker crashed"), (True, "B"), (True, "C")]


def test_a_library_that_uses_the_childs_stdout_or_stdin_does_not_touch_the_frames():
    """Bytes a C library printf-ed to descriptor 1 were read as a frame's length: the parent then waited,
    with no time limit, for a frame that never came, and the shard hung. A read of stdin took a frame."""
    w = TimeLimitedWorker("tests.sandbox_targets:upper_noisy")
    out: list = []
    items = ["a", "printf", "b", "tool", "c", "stdin", "d"]
    stop = threading.Event()

    def run() -> None:
        with stopping.stoppable(stop), contextlib.suppress(stopping.ShardsStopped):
            out.extend(w.map(items, time_limit=120.0))

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        t.join(180)  # a guard only: the old code never returned
        if t.is_alive():
            stop.set()  # the map stops at its next check, which the child's end below lets it reach
            w.proc.kill()
            t.join()
            pytest.fail("the sandbox hung on a library using the child's stdout or stdin")
    finally:
        w.close()
    assert out == [(True, x.upper()) for x in items] and w.restarts == 0


@pytest.fixture
def helper_pids(tmp_path, monkeypatch):
    """Where a target records the processes it leaves behind; each is ended after the test."""
    path = tmp_path / "helpers"
    path.touch()
    monkeypatch.setenv("SANDBOX_TEST_HELPER_PIDS", str(path))
    yield path
    import signal
    for pid in path.read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def test_a_child_that_dies_leaving_a_process_holding_its_pipe_is_still_a_crash(helper_pids):
    """No EOF comes while a process the child forked holds its frame pipe: the death was seen only when the page's
    time limit ran out, counted as a timeout (and before the child was up, the shard waited START_TIMEOUT_S)."""
    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_die_leaving_a_helper")
    try:
        out = list(w.map(["a", "die", "b"], time_limit=120.0))
    finally:
        w.close()
    assert out == [(True, "A"), (False, "worker crashed"), (True, "B")] and w.restarts == 0
    assert helper_pids.read_text().strip()  # the helper did hold the pipe


def test_a_child_that_cannot_start_leaving_a_process_holding_its_pipe_fails_at_once(helper_pids, monkeypatch):
    monkeypatch.setenv("SANDBOX_TEST_BREAK_AT_IMPORT", "1")
    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_hang")
    with pytest.raises(RuntimeError, match=r"exited with code 1 before it was up: ImportError: broken at import"):
        list(w.map(["a"], time_limit=120.0))
    assert helper_pids.read_text().strip()


def test_a_reused_worker_whose_child_died_while_idle_starts_afresh_blaming_no_item():
    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_die")
    try:
        assert list(w.map(["a"], time_limit=30.0)) == [(True, "A")]
        w.proc.kill()  # e.g. the kernel's OOM killer, between two shards
        w.proc.wait()
        assert list(w.map(["b", "c"], time_limit=30.0)) == [(True, "B"), (True, "C")]
    finally:
        w.close()


def test_a_worker_whose_pipes_are_past_descriptor_1023_still_works():
    """A process running many shards in threads (each with a sandbox child and its pipes) passes 1023
    open descriptors; select() refused them ("filedescriptor out of range") and the shard failed."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 1200
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"this machine allows {hard} open files")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    held = []
    try:
        while not held or held[-1] < 1100:  # the lowest free numbers are taken: the child's pipes come after
            held.append(os.open(os.devnull, os.O_RDONLY))
        w = TimeLimitedWorker("tests.sandbox_targets:upper_or_hang")
        try:
            out = list(w.map(["a", "hang", "b"], time_limit=3.0))
            assert w.proc.stdout.fileno() > 1023
        finally:
            w.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert out == [(True, "A"), (False, TIMED_OUT), (True, "B")]


def test_a_worker_started_from_another_directory_finds_the_project(tmp_path, monkeypatch):
    """Run from another working directory, the child (no `site`, so no editable-install finder) found no
    `tasks`: every page of every shard failed as 'worker crashed' and the shards completed empty. Found by
    an operator drill."""
    import sys
    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [x for x in sys.path if x not in ("", ".", root)])
    w = TimeLimitedWorker("tasks.extract.sandbox_child:frame")
    try:
        assert [ok for ok, _ in w.map(["a", "b"], time_limit=30.0)] == [True, True]
    finally:
        w.close()


def test_a_worker_that_cannot_start_fails_at_once_naming_why():
    """A child that dies before it is up fails the shard with its own last line (each page was counted
    as a crash, the child restarted for every one, and the console got its traceback each time)."""
    w = TimeLimitedWorker("tasks.no_such_module:fn")
    with pytest.raises(RuntimeError, match=r"exited with code 1 before it was up: ModuleNotFoundError: "
                                           r"No module named 'tasks.no_such_module'"):
        list(w.map(["a", "b", "c"], time_limit=30.0))
    assert w.restarts == 0 and w.proc is None


def test_a_reused_worker_starts_each_call_with_a_fresh_clock():
    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_hang")
    try:
        assert list(w.map(["a", "b"], time_limit=3.0)) == [(True, "A"), (True, "B")]
        import time

        time.sleep(3.5)  # longer than the limit: idle time between calls must not count
        assert list(w.map(["c"], time_limit=3.0)) == [(True, "C")]
        assert w.restarts == 0
    finally:
        w.close()


def test_a_caller_slower_than_the_limit_between_items_times_out_nothing():
    """The caller's own work between two answers (a model loaded, a numba function compiled on the
    first document: seen as a false extract_timeout in CI) is not the child's time."""
    import select
    import time

    w = TimeLimitedWorker("tests.sandbox_targets:upper_or_hang")
    try:
        out = []
        for ok, result in w.map(["a", "b", "c", "hang", "d"], time_limit=2.0):
            out.append((ok, result))
            if len(out) == 1:  # stall past the limit, and until the child has answered "b"
                start = time.monotonic()
                while time.monotonic() - start < 2.5 or not select.select([w.proc.stdout], [], [], 0.1)[0]:
                    time.sleep(0.1)
        assert out == [(True, "A"), (True, "B"), (True, "C"), (False, TIMED_OUT), (True, "D")]
        assert w.restarts == 1
    finally:
        w.close()


def test_ctrl_c_reaching_the_child_mid_item_leaves_it_working(capfd):
    """Ctrl-C in a terminal signals the whole process group, the sandbox child with it: the child died
    with a KeyboardInterrupt traceback on the console, and its page was either resent to a new child
    or, where the parent read the closed pipe first, dropped as an extract error. The parent decides."""
    import os
    import signal
    import time
    w = TimeLimitedWorker("tests.sandbox_targets:slow_upper")
    # a child inherits an ignored SIGINT (a runner or a `&` job may ignore it); a handled one is reset
    # to the default on exec, which is what a child started from a terminal's run has
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        results = w.map(["a", "b", "c"], time_limit=30.0)
        assert next(results) == (True, "A")
        time.sleep(0.2)  # the child is inside "b" now
        child = w.proc.pid
        os.kill(child, signal.SIGINT)
        assert list(results) == [(True, "B"), (True, "C")]
        assert w.proc.pid == child and w.proc.poll() is None
        assert "KeyboardInterrupt" not in capfd.readouterr().err
    finally:
        signal.signal(signal.SIGINT, ignored)
        w.close()


def test_a_caller_that_stops_early_leaves_no_answers_for_the_next_call():
    """A shard that fails or is interrupted mid-way leaves the child with items it still answers; the
    next call on the same thread's worker must not take those answers for its own items."""
    w = TimeLimitedWorker("tests.sandbox_targets:slow_upper")
    try:
        results = w.map(["a", "b", "c", "d"], time_limit=30.0)
        assert next(results) == (True, "A")
        results.close()  # what an exception in the caller's loop does to the generator
        assert list(w.map(["x", "y"], time_limit=30.0)) == [(True, "X"), (True, "Y")]
    finally:
        w.close()


def test_trafilatura_option(extracted, tmp_path):
    p = parse_params(small_raw(tmp_path / "data", extract={"extractor": "trafilatura"}))
    warc = sorted((Path(extracted.paths.data_dir) / "download/shards").glob("*.warc.gz"))[0]
    st = process(Shard("t", (str(warc),), "t.parquet"), tmp_path / "t.parquet", p, Context("extract", str(tmp_path)))
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert st.docs_out >= 10 and all("Copyright" not in r["text"] for r in rows)


def test_to_utf8_passes_valid_utf8_through_and_repairs_the_rest():
    from tasks.extract.html_text import to_utf8

    body = "café — ok".encode()
    same, repaired = to_utf8(body, "utf-8")
    assert same is body and not repaired  # no copy on the common path
    assert to_utf8(body, None) == (body, False)
    assert to_utf8("rivière".encode("latin-1"), "iso-8859-1") == ("rivière".encode(), False)
    # UTF-8 served as iso-8859-1 (a server default): kept as UTF-8, counted as repaired, not mojibake
    assert to_utf8("Le café était très agréable".encode(), "iso-8859-1") == ("Le café était très agréable".encode(), True)
    assert to_utf8("日本語のページ".encode(), "shift_jis") == ("日本語のページ".encode(), True)
    assert to_utf8("日本語のページ".encode("shift_jis"), "shift_jis") == ("日本語のページ".encode(), False)
    assert to_utf8("plain ascii".encode(), "iso-8859-1") == (b"plain ascii", False)
    assert to_utf8("€ in cp1252".encode("cp1252"), "windows-1252") == ("€ in cp1252".encode(), False)
    assert to_utf8(body, "x-klingon") == (body, True)  # unknown label, but valid UTF-8
    # labelled iso-8859-1 or us-ascii, written in windows-1252 (as browsers read both labels): curly quotes
    # and dashes, not the C1 controls Latin-1 gives them (which the filter took for binary)
    page = "The river\u2019s bank \u2014 \u201cquiet\u201d, they said\u2026 caf\u00e9"
    for label in ("iso-8859-1", "latin1", "ISO_8859-1", "us-ascii"):
        assert to_utf8(page.encode("cp1252"), label) == (page.encode(), False), label
    assert to_utf8(b"\x81 \x92", "iso-8859-1") == ("\x81 \u2019".encode(), False)  # unassigned: as browsers
    fixed, repaired = to_utf8(("café " * 50).encode("cp1252"), "utf-8")  # mislabelled
    assert repaired and fixed.decode("utf-8").startswith("caf")


def test_to_utf8_decodes_as_browsers_do():
    """A review of real pages against the WHATWG Encoding Standard and the HTML prescan (each case was mojibake,
    a dropped page, or a crash of the whole stage)."""
    from tasks.extract.html_text import to_utf8
    korean = "서울의 날씨 예보입니다. 내일은 맑은 후 흐림, 최고 기온은 이십오 도로 예상됩니다. " * 3
    page = lambda meta, text, codec: f"<html><head>{meta}</head><body><p>{text}</p></body></html>".encode(codec)  # noqa: E731
    text = lambda got: got[0].decode()  # noqa: E731
    # the charset only in <meta> (uchardet's "cp949" was read as utf-8, then cp1252: Latin mojibake tagged Spanish)
    for meta in ('<meta charset="euc-kr">', '<meta http-equiv="Content-Type" content="text/html; charset=euc-kr">', ""):
        assert korean in text(to_utf8(page(meta, korean, "cp949"), None)), meta
    # labelled EUC-KR / Shift_JIS / Big5 / ISO-8859-9 / TIS-620: browsers decode the vendors' supersets
    cases = {"euc-kr": ("똠방각하 " + korean, "cp949"), "ks_c_5601-1987": ("햏자 " + korean, "cp949"),
             "shift_jis": ("株式会社①の説明、№５、㈱サンプル商事", "cp932"), "windows-31j": ("第②章", "cp932"),
             "big5": ("峯景大廈和嘅字都係香港常用字", "big5hkscs"), "iso-8859-9": ("Türkiye’nin “Ankara”’dır — İstanbul", "cp1254"),
             "tis-620": ("ประเทศไทย “สวัสดี” — กรุงเทพ", "cp874"), "gb2312": ("欢迎光临本站，祝您购物愉快！", "gb18030")}
    for label, (want, codec) in cases.items():
        assert to_utf8(want.encode(codec), label) == (want.encode(), False), label
    # a <meta> charset Python and UTF-8 alone misread: 7-bit ISO-2022-JP passed as "UTF-8"; iso-8859-15's €
    for meta, want in (("iso-2022-jp", "東京都の天気予報です。"), ("iso-8859-15", "Le menu coûte 15 €"), ("koi8-u", "Києва")):
        body = page(f'<meta charset="{meta}">', want, meta)
        assert want in text(to_utf8(body, None)) and not to_utf8(body, None)[1], meta
    # a byte order mark wins over the label (UTF-16 read as ISO-8859-1 was dropped as binary)
    welcome = "Welcome to the parish newsletter — café"
    for bom, codec in ((b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"), (b"\xef\xbb\xbf", "utf-8")):
        assert text(to_utf8(bom + welcome.encode(codec), "iso-8859-1")) == welcome, codec
    # UTF-8 with one stray byte (a Latin-1 no-break space, a crawl cut mid-character): one U+FFFD, not cp1252 mojibake
    stray = ("It’s the town’s autumn market — café au lait and crème brûlée. " * 4).encode()
    for body, label in ((stray[:40] + b"\xa0" + stray[40:], "utf-8"), (stray[:40] + b"\xa0" + stray[40:], None),
                        (stray + "é".encode()[:1], None)):
        got = text(to_utf8(body, label))
        assert "It’s the town’s" in got and "crème brûlée" in got and got.count("\ufffd") == 1, got
    # labels that name no charset are ignored as browsers ignore them (hex, base64, punycode crashed the stage)
    for label in ("hex", "base64", "zip", "uu", "punycode", "rot13", "unicode_escape", "utf-8\x00", "utf-7"):
        assert to_utf8(welcome.encode(), label) == (welcome.encode(), True), label


def test_http_headers_end_where_they_end_and_folded_lines_go_on():
    """LF-only headers before a CRLF body lost the body up to its first blank CRLF line (title, heading, first
    paragraph); a folded header line (obs-fold) was dropped, and with it the charset it carried."""
    from tasks.extract.warc_reader import parse_http
    body = b"<html>\r\n<head><title>Council news</title></head>\r\n\r\n<body><p>Footpath approved</p></body></html>\r\n"
    assert parse_http(b"HTTP/1.1 200 OK\nContent-Type: text/html\n\n" + body) == (200, {"content-type": "text/html"}, body)
    status, headers, rest = parse_http(b"HTTP/1.1 200 OK\r\nContent-Type: text/html;\r\n\tcharset=euc-kr\r\n"
                                       b"Server: x\r\n\r\n" + body)
    assert headers == {"content-type": "text/html; charset=euc-kr", "server": "x"} and rest == body


def test_sandbox_reports_a_result_that_is_not_plain_data_and_goes_on():
    w = TimeLimitedWorker("tests.sandbox_targets:not_plain_data")
    try:
        out = list(w.map(["a", "object", "b"], time_limit=5.0))
        assert out[0] == (True, "a") and out[2] == (True, "b")
        assert out[1][0] is False and "plain data" in out[1][1]
        assert w.restarts == 0
        with pytest.raises(TypeError, match="plain data"):
            list(w.map([object()], time_limit=5.0))
    finally:
        w.close()


def test_record_header_reads_what_the_full_parse_reads():
    from tasks.extract.warc_reader import _records

    head = (b"WARC/1.0\r\nWARC-Type:  Response \r\nwarc-target-uri: https://a.example/x?y=1\r\n"
            b"Content-Type : application/http; msgtype=response\r\nX-Twice: 1\r\nX-Twice: 2\r\n"
            b"Content-Length: 3\r\n\r\nabc\r\n\r\n")
    (rec,) = list(_records(head))
    names = ["warc-type", "warc-target-uri", "content-type", "x-twice", "content-length", "missing"]
    lazy = [rec.header(n, "?") for n in names]
    assert rec.type == "response" and rec.payload == b"abc"
    assert lazy == [rec.headers.get(n, "?") for n in names]
    assert lazy[3] == "2"  # the last of repeated names wins, as in the dict


NEWS_PAGE = ("<html><head><title>t</title></head><body><nav><a href=/>Home</a> <a href=/news>News</a></nav><main><article>"
           "<h1>The harbour reopens after the storm</h1><p>The harbour master said on Monday that the piers had been "
           "repaired and that the ferries would run again from the first week of the month.</p>{}</article>"
           "<section id=comments class=comments-area><h2>3 Responses</h2><ol class=comment-list><li class=comment>"
           "<p>Buy cheap watches online says: best replica watches at our store</p></li></ol><div id=respond>"
           "<h3>Leave a Reply</h3><p>Your email address will not be published. Required fields are marked *</p>"
           "</div></section></main><footer>Copyright 2024</footer></body></html>")


@pytest.mark.parametrize("html, text", [
    ("<p>Tickets cost <span>€</span>25; pages <a>10</a>–<a>20</a>; 他说<b>好</b>。</p>",
     "Tickets cost €25; pages 10–20; 他说好。"),  # resiliparse took a lone 3-byte character for an icon glyph
    ("<p>Shop: <span class=woocommerce-Price-currencySymbol>&euro;</span>25; pages 10</a>&#8211;<a>20</p>",
     "Shop: €25; pages 10–20"),  # the same characters as entities
    ("<p>Icons stay out: <i class=icon>\ue001</i>Home<i>&#xE002;</i></p>", "Icons stay out: Home"),  # private use
    ("<p>One.</p><p>&#8203;</p><p>Two.</p><p>\u200b</p><p>Three.</p>", "One.\n\nTwo.\n\nThree."),  # spacers stay out
    ("<p>Die Bundes&shy;regierung hat ent&shy;schieden.</p>", "Die Bundesregierung hat entschieden."),
    ('<figure class="wp-block-table"><table><tr><td>Ferry</td><td>Departs</td></tr></table>'
     '<figcaption>Summer timetable</figcaption></figure><p><img src=a.png alt="a photo of the pier"></p>',
     "Ferry\t\tDeparts\nSummer timetable"),
])
@pytest.mark.parametrize("article_class", ["post", "post category-comment tag-harbour", "post comments-open"])
def test_main_text_keeps_what_resiliparse_dropped_and_drops_comment_sections(html, text, article_class):
    """Each case lost text a reader sees, or kept what is not the article: a lone €, – or 好 between tags,
    everything in a <figure> (WordPress tables), soft hyphens inside words, and the
    comment section with its spam and "Leave a Reply" form; invisible spacers and icon glyphs stay out."""
    from tasks.extract.html_text import main_text
    # (resiliparse's comments=False dropped a whole post whose classes held a `comment` token: filed under Comment)
    out = main_text(NEWS_PAGE.replace("<article>", f"<article class='{article_class}'>").format(html).encode(),
                    "resiliparse")
    paragraphs = out.split("\n\n")
    assert paragraphs[:2] == ["The harbour reopens after the storm", "The harbour master said on Monday that the "
                              "piers had been repaired and that the ferries would run again from the first week of "
                              "the month."], out
    assert "\n\n".join(paragraphs[2:]) == text, out
