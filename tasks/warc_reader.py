"""A forgiving WARC reader that names what it could not read.

Common Crawl writes one gzip member per record, so the reader works member by member: a corrupt
member is skipped by resynchronising on the next gzip magic, a truncated tail is reported once,
and a record it cannot parse is reported with its reason instead of aborting the file.
Yields `Record`s and, for every piece it skips, a reason string (counted in stats.json).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from zlib_ng import zlib_ng as zlib  # the stdlib zlib API; inflates ~1.5x faster (measured on CC-style members)

GZIP_MAGIC = b"\x1f\x8b\x08"
CHUNK = 64 << 10  # small reads: zlib copies all input left after a member into unused_data
MAX_MEMBER = 256 << 20  # a single record larger than this is not a web page


@dataclass
class Record:
    version: str
    headers: dict[str, str]  # lower-cased names
    payload: bytes

    @property
    def type(self) -> str:
        return self.headers.get("warc-type", "").lower()


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
        while data.startswith(b"\r\n", pos) or data.startswith(b"\n", pos):
            pos += 2 if data.startswith(b"\r\n", pos) else 1
        if pos >= n:
            return
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            yield "malformed_record"
            return
        lines = data[pos:end].split(b"\r\n")
        version = lines[0].strip().decode("latin-1")
        if not version.startswith("WARC/"):
            yield "malformed_record"
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if sep:
                headers[k.strip().lower().decode("latin-1")] = v.strip().decode("utf-8", "replace")
        try:
            length = int(headers["content-length"])
            if length < 0:
                raise ValueError
        except (KeyError, ValueError):
            yield "malformed_record"
            return
        start = end + 4
        payload = data[start:start + length]
        if len(payload) < length:
            yield "truncated_record"
            return
        if version not in ("WARC/1.0", "WARC/1.1"):
            yield "unsupported_warc_version"  # e.g. WARC/0.18 headers from pre-standard crawls
        else:
            yield Record(version, headers, payload)
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
    lines = payload[:end].replace(b"\r\n", b"\n").split(b"\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError("bad HTTP status line")
    headers = {}
    for line in lines[1:]:
        k, s, v = line.partition(b":")
        if s:
            headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
    return int(parts[1]), headers, payload[end + sep:]
