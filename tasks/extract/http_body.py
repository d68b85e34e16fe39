"""An HTTP response body as the server meant it: de-chunked and decompressed.

Crawlers differ in what they store. Some keep the bytes on the wire (`Transfer-Encoding: chunked`
framing, gzip/deflate/br content), some store the decoded body but keep the headers. So each
step looks at the bytes, not only the header: it decodes what is encoded, passes through what is
not, and says which it did (the stage counts each outcome in stats.json).
"""
from __future__ import annotations

import re

from zlib_ng import zlib_ng

_CHUNK_SIZE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r?\n")
MAX_DECODED = 64 << 20  # a decompression bomb stops here (the stage's size limit applies after)


def dechunk(body: bytes) -> tuple[bytes, str]:
    """(body, outcome): outcome is "dechunked", "chunked_header_plain_body" (no chunk framing at
    the start: stored already de-chunked) or "chunked_framing_broken" (raw body kept)."""
    if not _CHUNK_SIZE.match(body):
        return body, "chunked_header_plain_body"
    out, pos = [], 0
    while True:
        m = _CHUNK_SIZE.match(body, pos)
        if m is None:
            return body, "chunked_framing_broken"
        size, pos = int(m.group(1), 16), m.end()
        if size == 0:  # the last chunk; trailers, if any, are not part of the body
            return b"".join(out), "dechunked"
        if pos + size > len(body):
            return body, "chunked_framing_broken"
        out.append(body[pos:pos + size])
        pos += size
        if body.startswith(b"\r\n", pos):
            pos += 2
        elif body.startswith(b"\n", pos):
            pos += 1
        elif pos < len(body):
            return body, "chunked_framing_broken"
        else:  # the data ends without the last (zero) chunk: keep what arrived
            return b"".join(out), "dechunked"


def _inflate(body: bytes, wbits: int) -> bytes | None:
    d = zlib_ng.decompressobj(wbits)
    try:
        out = d.decompress(body, MAX_DECODED)
    except zlib_ng.error:
        return None
    return out if out or d.eof else None


def _brotli(body: bytes) -> bytes | None:
    """Brotli, at most MAX_DECODED bytes (brotli.decompress has no limit: 1.6 KB became 1 GiB). A body cut
    short (WARC-Truncated) keeps what arrived, as gzip's and deflate's do; a corrupt one is None."""
    import brotli

    d, out, size = brotli.Decompressor(), [], 0
    try:
        piece = d.process(body, output_buffer_limit=MAX_DECODED)
        while True:
            out.append(piece)
            size += len(piece)
            if size >= MAX_DECODED or d.can_accept_more_data():
                break
            piece = d.process(b"", output_buffer_limit=MAX_DECODED - size)
    except brotli.error:
        return None
    return b"".join(out)[:MAX_DECODED] or None


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _zstd(body: bytes) -> bytes | None:
    """Zstandard (RFC 8878, Content-Encoding: zstd), at most MAX_DECODED bytes; a cut body keeps what arrived."""
    import io

    import zstandard

    out, size = [], 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True) as r:
            while size < MAX_DECODED and (piece := r.read(min(1 << 20, MAX_DECODED - size))):
                out.append(piece)
                size += len(piece)
    except zstandard.ZstdError:
        pass
    return b"".join(out) or None


def decode_content(body: bytes, encoding: str) -> tuple[bytes | None, str]:
    """(body or None, outcome) for a `Content-Encoding` header value. Outcomes: "identity",
    "content_decoded", "encoding_header_plain_body" (the bytes were not encoded, or the value names no
    coding), or "content_undecodable" (body None: encoded but broken, or in an unknown coding)."""
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    codings = [c for c in codings if c not in ("identity", "none")]
    if not codings:
        return body, "identity"
    decoded = body
    for coding in reversed(codings):  # the last applied is the first to undo
        if coding in ("gzip", "x-gzip"):
            out = _inflate(decoded, 31) if decoded[:2] == b"\x1f\x8b" else None
        elif coding == "deflate":  # zlib-wrapped as the RFC says, or raw deflate as many servers send
            out = None if _looks_plain(decoded) else (_inflate(decoded, 15) or _inflate(decoded, -15))
        elif coding == "br":  # no magic number: plain-looking bytes are not tried as brotli
            out = None if _looks_plain(decoded) else _brotli(decoded)
        elif coding == "zstd":
            out = _zstd(decoded) if decoded.startswith(ZSTD_MAGIC) else None
        else:  # "UTF-8", "text/html", "binary", "chunked": not a coding; as warcio and browsers, the bytes are kept
            out = None
        if out is None:  # a layer not applied ("gzip, gzip" on a body gzipped once): the layers undone so far
            if not _looks_plain(decoded):
                return None, "content_undecodable"
            return decoded, "encoding_header_plain_body" if decoded is body else "content_decoded"
        decoded = out
    return decoded, "content_decoded"


def _looks_plain(body: bytes) -> bool:
    """Markup or text, not compressed bytes: stored decoded although the header says otherwise."""
    head = body[:512].lstrip()
    if head[:1] == b"<":
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(head) - 4  # only a character cut at the sample's end
    return True


def gunzip_unlabelled(body: bytes) -> bytes | None:
    """A gzip body sent without `Content-Encoding` (misconfigured servers, some crawlers' storage),
    decompressed; None when it is not one."""
    return _inflate(body, 31) if body[:2] == b"\x1f\x8b" else None


# File signatures of what servers mislabel text/html most: documents, images, archives, fonts, media
_BINARY_MAGIC = (b"%PDF-", b"\x89PNG", b"GIF87a", b"GIF89a", b"\xff\xd8\xff", b"PK\x03\x04", b"\x1f\x8b",
                 b"\x7fELF", b"RIFF", b"OggS", b"wOFF", b"wOF2", b"\xd0\xcf\x11\xe0", b"Rar!", b"7z\xbc\xaf")
# C0 controls other than tab, newlines, form feed and ESC (ISO-2022 pages use it): absent from text
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27))


def has_binary_signature(body: bytes) -> bool:
    """The raw body starts with a file signature (checked before any charset decoding changes its bytes)."""
    return body[:16].lstrip().startswith(_BINARY_MAGIC)


def looks_binary(utf8_body: bytes) -> bool:
    """A body (already UTF-8) that is not text: over 1% control bytes in its first 4 KiB, and more than
    two (random or compressed bytes have ~10%; HTML has none, or a stray one)."""
    head = utf8_body[:4096]
    return len(head) - len(head.translate(None, _CONTROL)) > max(2, len(head) // 100)
