"""The loopback HTTP servers (the sample crawl's, Data Docs') when a client hangs up mid-response: Ctrl-C of
`make run` during the download stage printed the sample server's BrokenPipeError traceback into the log of
what was otherwise a clean stop."""
from __future__ import annotations

import functools
import socket
import struct
import threading
from http.server import SimpleHTTPRequestHandler

import pytest

from tasks.sample.server import LoopbackHTTPServer, StaticHandler, StaticServer

BIG = 64 << 20  # far more than the kernel's socket buffers hold, so the server is still writing at the hang-up


def hang_up_mid_response(url: str, path: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.")  # the response has begun
        # close with a reset, as the socket of a process killed mid-read does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


def finish_handlers(before: list[threading.Thread]) -> None:
    for t in handler_threads():
        if t not in before:
            t.join(timeout=120)
            assert not t.is_alive(), "the server kept writing to a client that had hung up"


def test_a_client_hanging_up_mid_download_prints_nothing(tmp_path, capsys):
    (tmp_path / "big.warc.gz").write_bytes(b"\0" * BIG)
    before = handler_threads()
    with StaticServer(tmp_path) as url:
        hang_up_mid_response(url, "/big.warc.gz")
        finish_handlers(before)
    assert capsys.readouterr().err == ""


def test_a_browser_closing_a_data_docs_page_mid_load_prints_nothing(tmp_path, capsys):
    (tmp_path / "index.html").write_bytes(b"<p>" * (BIG // 3))
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = LoopbackHTTPServer(("127.0.0.1", 0), handler)
    before = handler_threads()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hang_up_mid_response(f"http://127.0.0.1:{server.server_address[1]}", "/index.html")
        finish_handlers(before)
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capsys.readouterr().err  # SimpleHTTPRequestHandler logs each request; no traceback


class BrokenHandler(StaticHandler):
    def send_body(self, data, start, status):
        raise ValueError("a bug in the handler")


def test_any_other_handler_error_still_prints_its_traceback(tmp_path, capsys):
    (tmp_path / "f").write_bytes(b"x")
    before = handler_threads()
    with StaticServer(tmp_path, BrokenHandler) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(b"GET /f HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096) == b""  # the server closed the connection without answering
        finish_handlers(before)
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: a bug in the handler" in err
