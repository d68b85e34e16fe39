"""A forgiving WARC reader that names what it could not read.

Common Crawl writes one gzip member per record, so the reader works member by member: a corrupt
member is skipped by resynchronising on the next gzip magic, a truncated tail is reported once,
and a record it cannot parse is reported with its reason instead of aborting the file.
Yields `Record`s and, for every piece it skips, a reason string (counted in stats.json).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO, Iterator

from zlib_ng import zlib_ng as zlib  # the stdlib zlib API; inflates ~1.5x faster (measured on CC-style members)

GZIP_MAGIC = b"\x1f\x8b\x08"
CHUNK = 64 << 10  # small reads: zlib copies all input left after a member into unused_data
MAX_MEMBER = 256 << 20  # a single record larger than this is not a web page


class Record:
    """One WARC record. Headers are parsed on demand: most records in a Common Crawl file are
    requests and metadata that the stage only counts, and of a response it reads two headers."""

    __slots__ = ("version", "_head", "_headers", "_type", "payload")

    def __init__(self, version: str, head: bytes, payload: bytes):
        self.version, self._head, self.payload = version, head, payload
        self._headers: dict[str, str] | None = None
        self._type: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """All headers, names lower-cased; the last of repeated names wins."""
        if self._headers is None:
            self._headers = {}
            for line in self._head.decode("utf-8", "replace").split("\r\n")[1:]:
                k, sep, v = line.partition(":")
                if sep:
                    self._headers[k.strip().lower()] = v.strip()
        return self._headers

    def header(self, name: str, default: str = "") -> str:
        """One header (`name` lower-case), read as `headers` would read it, without parsing all."""
        if self._headers is not None:
            return self._headers.get(name, default)
        value = _last_value(name, self._head)
        return value.decode("utf-8", "replace") if value is not None else default

    @property
    def type(self) -> str:
        if self._type is None:
            self._type = self.header("warc-type").lower()
        return self._type


_HEADER: dict[str, re.Pattern] = {}
_BLANK_LINES = re.compile(rb"(?:\r?\n)*")


def _last_value(name: str, head: bytes) -> bytes | None:
    """The last `name:` header's value in a header block, stripped as Record.headers strips it."""
    pattern = _HEADER.get(name)
    if pattern is None:
        pattern = _HEADER[name] = re.compile(
            rb"\r\n[ \t]*" + re.escape(name.encode()) + rb"[ \t]*:[ \t]*(.*?)[ \t]*(?=\r\n)", re.I)
    found = pattern.findall(head + b"\r\n")
    return found[-1] if found else None


def _resync(buf: bytes, fh: BinaryIO) -> bytes:
    """Drop bytes up to the next gzip member header (or EOF)."""
    while True:
        i = buf.find(GZIP_MAGIC)
        if i >= 0:
            return buf[i:]
        more = fh.read(CHUNK)
        if not more:
            return b""
        buf = buf[-2:] + more


def _members(fh: BinaryIO) -> Iterator[bytes | str]:
    buf = fh.read(CHUNK)
    while buf:
        d, out, size = zlib.decompressobj(31), [], 0
        while True:
            try:
                piece = d.decompress(buf)
            except zlib.error:
                yield "corrupt_gzip"
                buf = _resync(buf[1:], fh)
                break
            size += len(piece)
            if size > MAX_MEMBER:
                yield "record_too_large"
                buf = _resync(d.unused_data or fh.read(CHUNK), fh)
                break
            out.append(piece)
            if d.eof:
                yield b"".join(out)
                buf = d.unused_data or fh.read(CHUNK)
                break
            buf = fh.read(CHUNK)
            if not buf:
                yield "truncated_gzip"
                return


def _records(data: bytes) -> Iterator[Record | str]:
    pos, n = 0, len(data)
    while pos < n:
        pos = _BLANK_LINES.match(data, pos).end()  # the CRLF CRLF that ends the previous record
        if pos >= n:
            return
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            yield "malformed_record"
            return
        head = data[pos:end]
        version = head[:head.find(b"\r\n") if b"\r\n" in head else len(head)].strip().decode("latin-1")
        if not version.startswith("WARC/"):
            yield "malformed_record"
            return
        length = _last_value("content-length", head)
        if length is None or not length.isdigit():
            yield "malformed_record"
            return
        length = int(length)
        start = end + 4
        payload = data[start:start + length]
        if len(payload) < length:
            yield "truncated_record"
            return
        if version not in ("WARC/1.0", "WARC/1.1"):
            yield "unsupported_warc_version"  # e.g. WARC/0.18 headers from pre-standard crawls
        else:
            yield Record(version, head, payload)
        pos = start + length


def iter_warc(path: Path) -> Iterator[Record | str]:
    with open(path, "rb") as fh:
        head = fh.read(3)
        fh.seek(0)
        if head == GZIP_MAGIC:
            for member in _members(fh):
                if isinstance(member, str):
                    yield member
                else:
                    yield from _records(member)
        else:  # uncompressed WARC (rare): read whole; Common Crawl always ships gzip
            yield from _records(fh.read())


def parse_http(payload: bytes) -> tuple[int, dict[str, str], bytes]:
    """Split an HTTP response block into (status, lower-cased headers, body). ValueError if malformed."""
    end, sep = payload.find(b"\r\n\r\n"), 4
    if end < 0:
        end, sep = payload.find(b"\n\n"), 2
    if end < 0:
        raise ValueError("no end of HTTP headers")
    lines = payload[:end].decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError("bad HTTP status line")
    headers = {}
    for line in lines[1:]:
        k, s, v = line.partition(":")
        if s:
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers, payload[end + sep:]
