"""The real download code against a local server on 127.0.0.1 that injects faults."""
from __future__ import annotations

import gzip
import sys
import threading
import time
from dataclasses import replace

import pytest

from tasks.download.http_fetch import (DownloadError, RetryPolicy, UnsafePathError, fetch, gzip_complete,
                              safe_filename, safe_url)
from tasks.sample.server import StaticHandler, StaticServer, etag

PAYLOAD = b"".join(gzip.compress(f"record {i} ".encode() * 2000, mtime=0) for i in range(20))
# short backoffs; a time limit no response here comes near, however loaded the machine (the counts of
# attempts asserted below would change if one timed out)
FAST = RetryPolicy(retries=4, backoff_s=0.01, backoff_max_s=0.05, timeout_s=60.0)


class FaultHandler(StaticHandler):
    faults: list[str] = []  # consumed one per request; "ok" when empty
    log: list[dict] = []
    released = threading.Event()  # "slow" stalls until the test ends: longer than any client time limit
    stalled = threading.Event()  # "stall_mid" sent what it sends

    requests: list = []  # every request's Range, answered by send_body or not (a 416)

    def do_GET(self):
        self.requests.append(self.headers.get("Range"))
        super().do_GET()

    def send_body(self, data, start, status):
        fault = self.faults.pop(0) if self.faults else "ok"
        self.log.append({"range": self.headers.get("Range"), "fault": fault, "status": status})
        if fault == "500":
            self.send_error(500)
        elif fault == "503":
            self.send_error(503)
        elif fault.startswith("retry_after "):  # a rate limit: 429/503 and how long to wait
            code, value = fault.split(" ", 2)[1:]
            self.send_response(int(code))
            self.send_header("Retry-After", value)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif fault == "404":
            self.send_error(404)
        elif fault == "slow":
            self.released.wait(timeout=600)
            super().send_body(data, start, status)
        elif fault == "drop":  # promise the whole body, send half, hang up
            self.send_response(status)
            self.send_header("Content-Length", str(len(data) - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            self.wfile.write(data[start:start + (len(data) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif fault == "stall_mid":  # half the body, then nothing until the test ends
            self.send_response(status)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            self.wfile.write(data[start:start + (len(data) - start) // 2])
            self.wfile.flush()
            self.stalled.set()
            self.released.wait(timeout=600)
        elif fault in ("drop_unframed", "unframed"):  # no length, not chunked: the body ends as the connection closes
            self.send_response(status)
            self.send_header("Connection", "close")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            self.wfile.write(data[start:start + (len(data) - start) // (2 if fault == "drop_unframed" else 1)])
            self.wfile.flush()
            self.close_connection = True
        elif fault == "drop_then_change":  # as "drop", and the file is another version by the next request
            self.send_response(status)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", etag(data))
            self.end_headers()
            self.wfile.write(data[start:start + (len(data) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            path = self.resolve()
            path.write_bytes(bytes(b ^ 0x5A for b in data))  # same size, other bytes
        elif fault == "short_range" and status == 206:  # a range that ends before the file does
            end = start + (len(data) - start) // 2
            self.send_response(206)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            self.wfile.write(data[start:end])
        elif fault == "truncated":  # a complete HTTP transfer of an incomplete gzip
            super().send_body(data[: len(data) - 100], start, 200)
        elif fault == "ignore_range":
            super().send_body(data, 0, 200)
        else:
            super().send_body(data, start, status)


@pytest.fixture
def server(tmp_path):
    (tmp_path / "f.warc.gz").write_bytes(PAYLOAD)
    FaultHandler.faults, FaultHandler.log, FaultHandler.released = [], [], threading.Event()
    FaultHandler.requests = []
    FaultHandler.stalled = threading.Event()
    with StaticServer(tmp_path, FaultHandler) as url:
        yield url
        FaultHandler.released.set()


def test_clean_download(server, tmp_path):
    rep = fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert (tmp_path / "out").read_bytes() == PAYLOAD and rep.attempts == 1


def test_retries_5xx_with_backoff(server, tmp_path):
    FaultHandler.faults = ["500", "503", "500"]
    rep = fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert rep.attempts == 4 and (tmp_path / "out").read_bytes() == PAYLOAD


def test_dropped_connection_resumes_with_range(server, tmp_path):
    FaultHandler.faults = ["drop", "drop"]
    rep = fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert (tmp_path / "out").read_bytes() == PAYLOAD
    ranges = [e["range"] for e in FaultHandler.log]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[2].startswith("bytes=")
    assert int(ranges[2][6:-1]) > int(ranges[1][6:-1]) > 0
    assert rep.range_resumes == 2


PLAIN = b"WARC/1.0\r\n" + bytes(range(256)) * 400  # a .warc: no gzip check after the transfer to catch a bad one


@pytest.mark.parametrize("faults", [["drop_unframed"], ["drop", "short_range"], ["drop_unframed", "short_range"]])
def test_a_body_cut_or_a_range_short_of_the_end_is_resumed_not_taken_as_the_file(server, tmp_path, faults):
    """A body with no Content-Length (HTTP/1.0 style: it ends where the connection closes) cut short, or a 206
    whose Content-Range ends before the file does, was stored as the whole .warc: extract then read half the
    records and a `truncated_record`. The end is asked for (a range from there: 416 `bytes */size`)."""
    (tmp_path / "f.warc").write_bytes(PLAIN)
    FaultHandler.faults = list(faults)
    rep = fetch(f"{server}/f.warc", tmp_path / "out", FAST, verify_gzip=False)
    assert (tmp_path / "out").read_bytes() == PLAIN and not rep.unverified_end


def test_a_whole_body_without_a_length_is_checked_once_and_kept(server, tmp_path):
    (tmp_path / "f.warc").write_bytes(PLAIN)
    FaultHandler.faults = ["unframed"]
    rep = fetch(f"{server}/f.warc", tmp_path / "out", FAST, verify_gzip=False)
    assert (tmp_path / "out").read_bytes() == PLAIN and rep.attempts == 1 and not rep.unverified_end
    assert FaultHandler.requests == [None, f"bytes={len(PLAIN)}-"]  # the end, asked for


def test_a_file_changed_between_attempts_is_downloaded_whole_not_spliced(server, tmp_path):
    """A resume sends If-Range with the file's ETag: a file replaced between attempts (same size, other
    bytes) came back as its old first half and its new second half."""
    (tmp_path / "f.warc").write_bytes(PLAIN)
    FaultHandler.faults = ["drop_then_change"]
    fetch(f"{server}/f.warc", tmp_path / "out", FAST, verify_gzip=False)
    new = bytes(b ^ 0x5A for b in PLAIN)
    assert (tmp_path / "f.warc").read_bytes() == new and (tmp_path / "out").read_bytes() == new
    assert FaultHandler.log[1]["range"] is not None and FaultHandler.log[1]["status"] == 200


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    FaultHandler.faults = ["drop", "ignore_range"]
    fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert (tmp_path / "out").read_bytes() == PAYLOAD


def test_slow_response_times_out_and_retries(server, tmp_path):
    FaultHandler.faults = ["slow"]
    # the stall outlasts any limit, and the retry must answer within it on a loaded machine: 10 s, not 2
    rep = fetch(f"{server}/f.warc.gz", tmp_path / "out", replace(FAST, timeout_s=10.0))
    assert rep.attempts == 2 and (tmp_path / "out").read_bytes() == PAYLOAD


def test_a_rate_limits_retry_after_is_waited_for(server, tmp_path, monkeypatch):
    """A server that asks for more time than the backoff (S3's "slow down", a CDN's rate limit) got every retry
    before its window ended: the file failed after ~15 s with the defaults."""
    import datetime
    import email.utils

    from tasks.core import stopping
    waits: list[float] = []
    monkeypatch.setattr(stopping, "sleep", waits.append)  # what fetch asks to wait, not how long it took
    soon = email.utils.format_datetime(email.utils.localtime() + datetime.timedelta(seconds=40),
                                       usegmt=True)
    FaultHandler.faults = ["retry_after 503 20", "retry_after 429 100000", f"retry_after 503 {soon}",
                           "retry_after 503 soon-ish", "500"]
    rep = fetch(f"{server}/f.warc.gz", tmp_path / "out", replace(FAST, retries=5))
    assert (tmp_path / "out").read_bytes() == PAYLOAD and rep.attempts == 6
    assert waits[:2] == [20.0, 600.0]  # capped: a day-long ask would hold the shard for good
    assert 20 < waits[2] <= 40  # an HTTP date: the time left until it
    assert waits[3:] == [FAST.delay(3), FAST.delay(4)]  # unreadable, or none asked: the backoff
    assert rep.errors[:2] == ["HTTP 503 (Retry-After 20 s)", "HTTP 429 (Retry-After 600 s)"]


def self_signed(folder) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, in PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def test_a_tls_record_broken_mid_body_is_retried_from_where_it_stopped(tmp_path, monkeypatch):
    """ssl.SSLError ("bad record mac", as a flaky network gives on a long transfer) is an OSError but no
    ConnectionError: it was not retried, and it ended the whole download stage."""
    import os
    import socket
    import ssl
    cert, key = self_signed(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    ranges: list = []

    def serve() -> None:
        for n in range(2):
            raw, _ = listener.accept()
            with ctx.wrap_socket(raw, server_side=True) as s:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += s.recv(4096)
                asked = [x for x in request.decode().split("\r\n") if x.lower().startswith("range: bytes=")]
                ranges.append(asked[0][13:] if asked else None)
                start = int(asked[0][13:-1]) if asked else 0
                head = f"HTTP/1.1 {'206 Partial Content' if asked else '200 OK'}\r\nContent-Length: {len(PAYLOAD) - start}\r\n"
                if asked:
                    head += f"Content-Range: bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}\r\n"
                s.sendall(head.encode() + b"Connection: close\r\n\r\n")
                if n == 0:  # half the body, then an application-data record whose MAC cannot be right
                    s.sendall(PAYLOAD[:len(PAYLOAD) // 2])
                    with socket.socket(fileno=os.dup(s.fileno())) as under:
                        under.sendall(b"\x17\x03\x03\x00\x40" + b"\xaa" * 0x40)
                    continue
                s.sendall(PAYLOAD[start:])

    threading.Thread(target=serve, daemon=True).start()
    client = ssl.create_default_context(cafile=cert)
    monkeypatch.setattr(ssl, "_create_default_https_context", lambda *a, **k: client)  # trust the test's certificate
    try:
        rep = fetch(f"https://127.0.0.1:{listener.getsockname()[1]}/f.warc.gz", tmp_path / "out", FAST)
    finally:
        listener.close()
    assert (tmp_path / "out").read_bytes() == PAYLOAD
    assert rep.attempts == 2 and rep.range_resumes == 1 and ranges[0] is None and int(ranges[1][:-1]) > 0
    assert "SSLError" in rep.errors[0] or "SSL" in rep.errors[0], rep.errors


def in_socket_read(thread: threading.Thread) -> bool:
    frame, names = sys._current_frames().get(thread.ident), []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[:1] == ["readinto"] and "_stream" in names


def test_a_stop_ends_a_read_stalled_mid_transfer_at_once(server, tmp_path):
    """A shard thread waiting on a stalled server got no check and no asynchronous exception until the
    read timed out (download.timeout_s): `python -m tasks download` took 16 s to stop instead of 0.2
    once it ran shards in threads. The stop shuts the connection down."""
    import contextvars

    from tasks.core.shard_threads import ShardThreads, running_shard
    from tasks.core.stopping import ShardsStopped
    FaultHandler.faults, outcome = ["stall_mid"], []
    out = tmp_path / "out"

    def shard() -> None:
        try:
            with running_shard():
                fetch(f"{server}/f.warc.gz", out, replace(FAST, timeout_s=3600.0))  # longer than the test
            outcome.append("finished")
        except BaseException as e:
            outcome.append(type(e))

    threads = ShardThreads(grace_s=60.0)  # the stop, not the asynchronous exception after the grace (which
    # cannot reach a thread blocked in a read either: without the stop's shutdown the worker is still there)
    with pytest.raises(KeyboardInterrupt), threads.mapping():
        worker = threading.Thread(target=contextvars.copy_context().run, args=(shard,), daemon=True)
        worker.start()
        assert FaultHandler.stalled.wait(120)  # half the body sent
        waiting = 0  # then the worker inside the socket read for 20 polls running: it has read what was sent
        deadline = time.monotonic() + 120  # (a stop before that ends at the chunk's check, which is not this)
        while waiting < 20 and time.monotonic() < deadline:
            waiting = waiting + 1 if in_socket_read(worker) else 0
            time.sleep(0.02)
        assert waiting == 20
        raise KeyboardInterrupt
    worker.join(120)  # a guard against a hang: the read would wait an hour
    assert outcome == [ShardsStopped] and len(FaultHandler.log) == 1  # stopped, not retried


def test_truncated_gzip_is_redownloaded(server, tmp_path):
    FaultHandler.faults = ["truncated"]
    rep = fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert rep.restarts_truncated_gzip == 1 and gzip_complete(tmp_path / "out")


def test_never_complete_is_an_error_and_leaves_nothing(server, tmp_path):
    FaultHandler.faults = ["truncated"] * 10
    with pytest.raises(DownloadError, match="after 5 attempts"):
        fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert not (tmp_path / "out").exists()


def test_client_errors_are_not_retried(server, tmp_path):
    FaultHandler.faults = ["404"]
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(f"{server}/f.warc.gz", tmp_path / "out", FAST)
    assert len(FaultHandler.log) == 1


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "a/../../b.warc.gz", "http://evil.com/x.gz",
                                 "a//b.gz", "a/./b.gz", "a\\..\\b", "a b.gz", "", "x?y=1"])
def test_unsafe_listed_paths_are_rejected(bad):
    with pytest.raises(UnsafePathError):
        safe_url("https://data.commoncrawl.org", bad)


def test_only_http_base_urls():
    with pytest.raises(UnsafePathError):
        safe_url("file:///etc", "passwd")
    assert safe_url("https://data.commoncrawl.org/", "crawl-data/CC-MAIN-2020-50/warc.paths.gz") == \
        "https://data.commoncrawl.org/crawl-data/CC-MAIN-2020-50/warc.paths.gz"


def test_file_names_are_sanitised():
    assert safe_filename("crawl-data/x/CC-MAIN-1.warc.gz") == "CC-MAIN-1.warc.gz"
    assert safe_filename("a/.hidden;rm -rf $(x).gz") == "hidden_rm_-rf___x_.gz"
    with pytest.raises(UnsafePathError):
        safe_filename("a/...")
