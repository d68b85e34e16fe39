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
STREAM_AT = 64 << 20  # a gzip member larger than this is read in blocks of whole records (_members)


class Record:
    """One WARC record. Headers are parsed on demand: most records in a Common Crawl file are
    requests and metadata that the stage only counts, and of a response it reads two headers."""

    __slots__ = ("version", "_head", "_headers", "_type", "payload", "repaired")

    def __init__(self, version: str, head: bytes, payload: bytes):
        self.version, self._head, self.payload = version, head, payload
        self._headers: dict[str, str] | None = None
        self._type: str | None = None
        self.repaired: str | None = None  # what the reader had to work around (counted by the stage)

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
    def target_uri(self) -> str:
        """WARC-Target-URI without the angle brackets some writers put around it."""
        uri = self.header("warc-target-uri").strip()
        return uri[1:-1].strip() if uri.startswith("<") and uri.endswith(">") else uri

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


def _last_record_start(block: bytes) -> int:
    """Where the last record's version line starts in `block` (a line "WARC/x.y" after a line end); 0 if none."""
    i = len(block)
    while (i := block.rfind(b"\nWARC/", 0, i)) >= 0:
        if _VERSION_LINE.match(block, i + 1):
            return i + 1
    return 0


def _members(fh: BinaryIO) -> Iterator[bytes | str]:
    """Each gzip member's bytes, or the reason it could not be read. A member past STREAM_AT (a whole file
    compressed as one stream, as ClueWeb09's are) is given in blocks of whole records as it inflates: as one
    block, a file past MAX_MEMBER lost every record (1 GB uncompressed ClueWeb09 files); MAX_MEMBER then
    bounds what is held of one record."""
    buf = fh.read(CHUNK)
    while buf:
        d, out, size, split_at = zlib.decompressobj(31), [], 0, STREAM_AT
        while True:
            try:
                piece = d.decompress(buf)
            except zlib.error:
                yield "corrupt_gzip"
                buf = _resync(buf[1:], fh)
                break
            size += len(piece)
            if size > split_at:  # each try joins what is held: tried again only STREAM_AT later
                block = b"".join([*out, piece])
                if cut := _last_record_start(block):
                    yield block[:cut]
                out, piece, size = [], block[cut:], len(block) - cut
                split_at = size + STREAM_AT
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


SUPPORTED_VERSIONS = ("WARC/1.0", "WARC/1.1", "WARC/0.18", "WARC/0.17")  # 0.17/0.18: 2008-09 crawls, ClueWeb09
_NEXT_RECORD = re.compile(rb"(?:\r?\n)+(?=WARC/\d+\.\d+\r?\n)")
_VERSION_LINE = re.compile(rb"WARC/\d+\.\d+\r?\n")


def _head_end(data: bytes, pos: int) -> tuple[int, int]:
    """(end of the header block, length of its terminator); (-1, 0) if there is none. Headers end
    with CRLF CRLF, or LF LF in files whose line ends were stripped (ClueWeb09)."""
    # the LF LF search stops at the CRLF CRLF: over the rest of the file, for every record of a CRLF file with
    # no LF LF, it made reading an uncompressed (or whole-gzip) file quadratic (38 MiB: 86 s)
    crlf = data.find(b"\r\n\r\n", pos)
    lf = data.find(b"\n\n", pos, crlf if crlf >= 0 else len(data))
    if lf >= 0:
        return lf, 2
    return (crlf, 4) if crlf >= 0 else (-1, 0)


def _next_record(data: bytes, pos: int) -> int:
    """Where the next record's version line starts after `pos` (len(data) if none)."""
    m = _NEXT_RECORD.search(data, pos)
    return m.end() if m else len(data)


def _records(data: bytes, whole: bool = False) -> Iterator[Record | str]:
    """Every record of an uncompressed block, or the reason it could not be read: one entry per
    record, so a bad record never hides the ones after it. `whole`: the block is a gzip member that
    ended cleanly, so its end is where its writer ended the last record (a Content-Length past it is
    the writer's miscount, as within a block); the end of an uncompressed file may be a cut."""
    pos, n = 0, len(data)
    while pos < n:
        pos = _BLANK_LINES.match(data, pos).end()  # the CRLF CRLF that ends the previous record
        if pos >= n:
            return
        end, sep = _head_end(data, pos)
        head = data[pos:end] if end >= 0 else b""
        version = head.split(b"\n", 1)[0].strip().decode("latin-1")
        lf_only = b"\r\n" not in head
        if lf_only:
            head = head.replace(b"\n", b"\r\n")
        length = _last_value("content-length", head) if version.startswith("WARC/") else None
        if length is None or not length.isdigit():
            yield "malformed_record"
            pos = _next_record(data, pos)
            continue
        start, length = end + sep, int(length)
        stop, repaired = start + length, None
        after = _BLANK_LINES.match(data, min(stop, n)).end()
        if stop > n or (after < n and not data.startswith(b"WARC/", after)):
            # Content-Length disagrees with where the next record starts: stripped CRs (ClueWeb09),
            # off-by-one writers (some wget versions). Trust the next record's version line.
            nxt = _next_record(data, start)
            if stop > n and nxt == n and not lf_only and not whole:
                yield "truncated_record"  # a CRLF file cut short: the record is incomplete
                return
            stop, after, repaired = nxt, nxt, "content_length_mismatch"
            while stop > start and data[stop - 1] in b"\r\n":
                stop -= 1
        if version not in SUPPORTED_VERSIONS:
            yield "unsupported_warc_version"
        else:
            rec = Record(version, head, data[start:stop])
            rec.repaired = repaired
            yield rec
        pos = after


def not_warc(name: str) -> str | None:
    """Why a file is not something this stage reads (None if it is: a WARC or a curated shard)."""
    if name.endswith((".warc.wet.gz", ".wet.gz", ".warc.wat.gz", ".wat.gz")):
        kind = "WET (extracted text)" if ".wet" in name else "WAT (metadata)"
        return (f"a Common Crawl {kind} file; extract reads WARC files with the HTML "
                f"(use the crawl's warc.paths.gz listing)")
    if not name.endswith((".warc.gz", ".warc", ".parquet")):
        return "not a WARC file (.warc.gz, .warc) or a curated Parquet shard"
    return None


def iter_warc(path: Path) -> Iterator[Record | str]:
    with open(path, "rb") as fh:
        head = fh.read(3)
        fh.seek(0)
        if head == GZIP_MAGIC:
            for member in _members(fh):
                if isinstance(member, str):
                    yield member
                else:
                    yield from _records(member, whole=True)
        else:  # uncompressed WARC (rare): read whole; Common Crawl always ships gzip
            yield from _records(fh.read())


def parse_http(payload: bytes) -> tuple[int, dict[str, str], bytes]:
    """Split an HTTP response block into (status, lower-cased headers, body). ValueError if malformed."""
    end, sep = _head_end(payload, 0)  # the earlier ending: LF-only headers before a CRLF body lost its start
    if end < 0:
        raise ValueError("no end of HTTP headers")
    lines = payload[:end].decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError("bad HTTP status line")
    headers, last = {}, None
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and last is not None:  # obs-fold: the previous header goes on (RFC 7230 3.2.4)
            headers[last] = f"{headers[last]} {line.strip()}".strip()
            continue
        k, s, v = line.partition(":")
        if s:
            last = k.strip().lower()
            headers[last] = v.strip()
    return int(parts[1]), headers, payload[end + sep:]
