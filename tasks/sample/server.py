"""A small static HTTP server on 127.0.0.1 with Range support (and ETag / If-Range, as S3 and CDNs answer).

`make run` serves the sample crawl through it so the download stage exercises its real HTTP path;
tests subclass the handler to inject faults. Only ever binds to loopback.
`LoopbackHTTPServer` is also what `flows.docs_server` serves Data Docs with.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server for which a client hanging up mid-response is routine, not an error.

    socketserver prints a traceback to stderr for any exception a handler raises. A download cut short
    (Ctrl-C of `make run` while the download stage was reading the sample crawl, a browser tab closed
    while Data Docs loaded) raised BrokenPipeError or ConnectionResetError, and that traceback landed in
    the middle of the pipeline's log of a clean stop. Every other error still prints its traceback.
    """

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset, ConnectionAborted
            return
        super().handle_error(request, client_address)


def etag(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest()[:16] + '"'


class StaticHandler(BaseHTTPRequestHandler):
    root: Path = Path(".")
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test and pipeline output clean
        pass

    def resolve(self) -> Path | None:
        rel = unquote(urlparse(self.path).path).lstrip("/")
        target = (self.root / rel).resolve()
        root = self.root.resolve()
        if root not in target.parents and target != root:
            return None
        return target if target.is_file() else None

    def do_GET(self) -> None:
        path = self.resolve()
        if path is None:
            self.send_error(404)
            return
        data = path.read_bytes()
        start, status = 0, 200
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if self.headers.get("If-Range") not in (None, etag(data)):
            m = None  # the file changed since the client's first bytes: the whole of it
        if m:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_body(data, start, status)

    def send_body(self, data: bytes, start: int, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag(data))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(data[start:])


class StaticServer:
    """`with StaticServer(root) as base_url:` serves `root` until the block ends."""

    def __init__(self, root: str | os.PathLike, handler: type[StaticHandler] = StaticHandler, port: int = 0):
        self.handler = type("BoundHandler", (handler,), {"root": Path(root)})
        self.port = port
        self.httpd: LoopbackHTTPServer | None = None

    def __enter__(self) -> str:
        self.httpd = LoopbackHTTPServer(("127.0.0.1", self.port), self.handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()
