"""A minimal WARC/1.0 writer (one gzip member per record, as Common Crawl does).

Used by the sample generator and by tests that build deliberately broken archives.
Deterministic: gzip mtime is 0 and record ids come from the caller's RNG.
"""
from __future__ import annotations

import gzip
import random
import uuid


def record_bytes(rtype: str, uri: str | None, payload: bytes, *, date: str, rng: random.Random,
                 content_type: str | None = None, extra: dict[str, str] | None = None,
                 version: str = "WARC/1.0") -> bytes:
    headers = {
        "WARC-Type": rtype,
        "WARC-Date": date,
        "WARC-Record-ID": f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>",
    }
    if uri is not None:
        headers["WARC-Target-URI"] = uri
    if content_type:
        headers["Content-Type"] = content_type
    headers.update(extra or {})
    headers["Content-Length"] = str(len(payload))
    head = version + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("utf-8") + payload + b"\r\n\r\n"


def http_response(body: bytes, content_type: str = "text/html; charset=utf-8", status: str = "200 OK") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode("latin-1") + body


def http_request(uri: str) -> bytes:
    host = uri.split("/")[2] if "://" in uri else "example.com"
    return f"GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: CCBot/2.0\r\n\r\n".encode()


def gz(record: bytes) -> bytes:
    return gzip.compress(record, compresslevel=6, mtime=0)


class WarcBuilder:
    """Accumulates gzipped records; `page()` writes the request/response/metadata triple."""

    def __init__(self, rng: random.Random, date: str = "2020-11-23T15:38:26Z"):
        self.rng, self.date, self.parts = rng, date, []

    def add(self, rtype: str, uri: str | None, payload: bytes, content_type: str | None = None,
            **kw) -> None:
        self.parts.append(gz(record_bytes(rtype, uri, payload, date=self.date, rng=self.rng,
                                          content_type=content_type, **kw)))

    def warcinfo(self, filename: str, crawl: str = "") -> None:
        """As Common Crawl's: `isPartOf` names the snapshot (extract stamps each document's crawl with it)."""
        info = f"software: mtnlg-repro sample\r\nformat: WARC File Format 1.0\r\nfilename: {filename}\r\n"
        info += f"isPartOf: {crawl}\r\n" if crawl else ""
        self.add("warcinfo", None, info.encode(), "application/warc-fields")

    def page(self, uri: str, response: bytes) -> None:
        self.add("request", uri, http_request(uri), "application/http; msgtype=request")
        self.add("response", uri, response, "application/http; msgtype=response")
        self.add("metadata", uri, b"fetchTimeMs: 120\r\n", "application/warc-fields")

    def getvalue(self) -> bytes:
        return b"".join(self.parts)
