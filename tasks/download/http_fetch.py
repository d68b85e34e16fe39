"""Fault-tolerant HTTP download: retries with exponential backoff, Range resume, gzip check.

Nothing half-downloaded is ever reported as complete: a transfer is done only when the byte count
matches Content-Length and (for .gz) the gzip stream decodes to a clean end.
"""
from __future__ import annotations

import datetime
import email.utils
import http.client
import os
import re
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlparse

from zlib_ng import zlib_ng

from tasks.core import stopping
from tasks.core.errors import InputFileError, PipelineError


class DownloadError(PipelineError, RuntimeError):
    """A transfer that still failed after its retries (the message names the URL)."""

    label = "download error"


class UnsafePathError(InputFileError):
    """A listed path that would escape the base URL or the output folder."""


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    timeout_s: float = 60.0
    chunk: int = 1 << 20

    def delay(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * (2 ** attempt))


@dataclass
class FetchReport:
    bytes: int = 0
    attempts: int = 0
    range_resumes: int = 0
    restarts_truncated_gzip: int = 0
    unverified_end: bool = False  # a body with no length from a server that answers no range: taken as whole
    errors: list[str] = field(default_factory=list)
    validator: str | None = None  # the full body's strong ETag or Last-Modified: a resume's If-Range


_BAD_CHARS = re.compile(r"[\x00-\x20\x7f\\?#%]")


def safe_url(base_url: str, rel_path: str) -> str:
    """Join a listed path under the base URL, rejecting anything that could escape it."""
    base = urlparse(base_url)
    if base.scheme not in ("http", "https") or not base.netloc:
        raise UnsafePathError(f"base URL {base_url!r}: only http(s) URLs are allowed")
    segs = rel_path.split("/")
    if (not rel_path or rel_path.startswith("/") or "://" in rel_path or _BAD_CHARS.search(rel_path)
            or any(s in ("", ".", "..") for s in segs)):
        raise UnsafePathError(f"listed path {rel_path!r} rejected: must be a plain relative path")
    url = base_url.rstrip("/") + "/" + quote(rel_path, safe="/")
    got = urlparse(url)
    if got.netloc != base.netloc or not got.path.startswith(base.path.rstrip("/") + "/"):
        raise UnsafePathError(f"listed path {rel_path!r} resolves outside {base_url}")
    return url


def safe_filename(rel_path: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", rel_path.rsplit("/", 1)[-1]).lstrip(".")[:200]
    if not name:
        raise UnsafePathError(f"listed path {rel_path!r} has no usable file name")
    return name


def gzip_complete(path: Path) -> bool:
    """True iff the file is one or more complete gzip members and nothing else."""
    d = zlib_ng.decompressobj(31)
    members, pending = 0, False  # pending: bytes of a member whose end we have not seen yet
    with open(path, "rb") as fh:
        # small reads: at each member's end zlib copies the rest of the block into unused_data,
        # and a WARC file is one member per record
        while block := fh.read(64 << 10):
            while block:
                try:
                    d.decompress(block)
                except zlib_ng.error:
                    return False
                if d.eof:
                    members, pending = members + 1, False
                    block = d.unused_data
                    d = zlib_ng.decompressobj(31)
                else:
                    pending, block = True, b""
    return members > 0 and not pending


# ssl.SSLError: a TLS record broken mid-body ("bad record mac", an EOF without close_notify), as flaky
# networks give on long transfers; it is an OSError but no ConnectionError, and it ended the stage
_RETRYABLE = (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, ssl.SSLError,
              http.client.IncompleteRead, http.client.RemoteDisconnected, http.client.BadStatusLine)
RETRY_AFTER_MAX_S = 600.0  # a server's Retry-After is honoured up to this


def retry_after(headers) -> float | None:
    """Seconds a 429/503 response's Retry-After asks to wait (delay-seconds or an HTTP date); None if none."""
    value = (headers.get("Retry-After") or "").strip() if headers is not None else ""
    if not value:
        return None
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: the backoff alone
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return min(max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()), RETRY_AFTER_MAX_S)


USER_AGENT = "mtnlg-repro/0.1"


def _validator(headers) -> str | None:
    """What an If-Range may name: a strong ETag, else Last-Modified (a weak ETag may not be used)."""
    etag = (headers.get("ETag") or "").strip()
    return etag if etag.startswith('"') else (headers.get("Last-Modified") or "").strip() or None


def _stream(url: str, dest: Path, policy: RetryPolicy, rep: FetchReport) -> None:
    have = dest.stat().st_size if dest.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if have:
        req.add_header("Range", f"bytes={have}-")
        if rep.validator:  # a file changed since its first bytes came is sent whole (200), not spliced
            req.add_header("If-Range", rep.validator)
    total = None
    with urllib.request.urlopen(req, timeout=policy.timeout_s) as resp:
        status = resp.status
        if status == 206:
            m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != have:
                raise DownloadError(f"{url}: server sent range {resp.headers.get('Content-Range')!r}")
            total = None if m.group(3) == "*" else int(m.group(3))  # a range may end before the file does
            rep.range_resumes += 1
            mode = "ab"
        else:
            have, mode = 0, "wb"  # server ignored the Range header, or the file changed: start over
            rep.validator = _validator(resp.headers)
        expected = resp.headers.get("Content-Length")
        # no length and not chunked: the body ends where the connection closes, cut short or not
        unframed = expected is None and not resp.chunked
        got = 0
        # a stop while a read waits on a stalled server shuts the connection down: the read returns at once
        with open(dest, mode) as fh, stopping.on_stop(lambda: _shut_down(resp)):
            # read1: what has arrived, up to a chunk (read() waits for a whole MiB from a slow server)
            while chunk := resp.read1(policy.chunk):
                fh.write(chunk)
                got += len(chunk)
                stopping.check()
        stopping.check()  # the connection shut down by a stop: stopped, not a short read to retry
        if expected is not None and got != int(expected):
            raise http.client.IncompleteRead(b"", int(expected) - got)
    if total is not None and have + got != total:  # the next attempt asks for the rest
        raise http.client.IncompleteRead(b"", total - have - got)
    if unframed:
        ends = _ends_at(url, have + got, policy)
        if ends is False:  # a cut transfer (a .warc has no gzip check after it): the next attempt resumes
            raise http.client.IncompleteRead(b"", None)
        rep.unverified_end = ends is None


def _ends_at(url: str, size: int, policy: RetryPolicy) -> bool | None:
    """Whether the file has no byte past `size`, asked as a range from there: a 416 (with `bytes */size`,
    or no Content-Range) says so, a 206 says there is more; None where the server answers no range."""
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Range": f"bytes={size}-"})
    try:
        with urllib.request.urlopen(req, timeout=policy.timeout_s) as resp:
            return False if resp.status == 206 else None
    except urllib.error.HTTPError as e:
        if e.code != 416:
            raise
        return _range_end(e.headers) in (None, size)


def _range_end(headers) -> int | None:
    """The size a 416's Content-Range (`bytes */size`) gives; None without one."""
    m = re.fullmatch(r"bytes \*/(\d+)", (headers.get("Content-Range") or "").strip()) if headers is not None else None
    return int(m.group(1)) if m else None


def _shut_down(resp) -> None:
    """Unblock a read waiting on `resp`'s connection, from another thread (closing the response would wait
    for the read: both take its buffer's lock): shutdown() acts on the connection, through a duplicate of
    its descriptor, which is then closed."""
    with socket.socket(fileno=os.dup(resp.fileno())) as conn:
        conn.shutdown(socket.SHUT_RDWR)


def fetch(url: str, dest: Path, policy: RetryPolicy, verify_gzip: bool = True) -> FetchReport:
    """Download `url` to `dest` (created or resumed); raise DownloadError when retries run out."""
    rep = FetchReport()
    for attempt in range(policy.retries + 1):
        rep.attempts += 1
        asked = None  # the wait a rate-limiting server asked for
        try:
            _stream(url, dest, policy, rep)
            if verify_gzip and not gzip_complete(dest):
                rep.restarts_truncated_gzip += 1
                dest.unlink(missing_ok=True)
                raise DownloadError(f"{url}: gzip stream is truncated or corrupt")
            rep.bytes = dest.stat().st_size
            return rep
        except urllib.error.HTTPError as e:
            have = dest.stat().st_size if dest.exists() else -1
            if e.code == 416 and have > 0 and (gzip_complete(dest) if verify_gzip else _range_end(e.headers) == have):
                rep.bytes = have  # we already had every byte
                return rep
            if e.code == 416:
                dest.unlink(missing_ok=True)
            elif not (e.code >= 500 or e.code in (408, 429)):
                raise DownloadError(f"{url}: HTTP {e.code} {e.reason} (not retried)") from None
            asked = retry_after(e.headers) if e.code in (429, 503) else None
            rep.errors.append(f"HTTP {e.code}" + (f" (Retry-After {asked:.0f} s)" if asked is not None else ""))
        except DownloadError as e:
            if "truncated" not in str(e) and "range" not in str(e):
                raise
            if "range" in str(e):
                dest.unlink(missing_ok=True)
            rep.errors.append(str(e))
        except _RETRYABLE as e:
            stopping.check()  # a read cut short by a stop (its connection shut down) is not retried
            rep.errors.append(f"{e.__class__.__name__}: {e}")
        if attempt < policy.retries:
            # a server that asks for longer than the backoff (S3's "slow down", a CDN's rate limit) refused every
            # retry spent before its window ended: ~15 s of them by default
            stopping.sleep(max(policy.delay(attempt), asked or 0.0))
    raise DownloadError(f"{url}: failed after {rep.attempts} attempts: {'; '.join(rep.errors[-3:])}")


def fetch_bytes(url: str, policy: RetryPolicy, tmp: Path) -> bytes:
    fetch(url, tmp, policy, verify_gzip=url.endswith(".gz"))
    try:
        return tmp.read_bytes()
    finally:
        tmp.unlink(missing_ok=True)
