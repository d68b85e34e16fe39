"""WARC files with the quirks of real crawls, built by the project's own writer (and by hand where
the quirk is in the framing itself). Each builder returns (file bytes, HTML responses in it, the
main text each response should yield)."""
from __future__ import annotations

import brotli
import gzip
import random
import zlib

from tasks.sample.warc_writer import WarcBuilder, gz, http_response, record_bytes

PARAS = [
    "The river town held its autumn market on the old stone bridge, where farmers from the valley "
    "sold apples, cheese and wool to travellers heading north before the first snow closed the pass.",
    "Engineers at the regional water board replaced the ageing pumps last spring, and the new system "
    "now moves twice as much water with half of the electricity the old machines needed every day.",
    "Volunteers planted four hundred oak and beech saplings along the eroded hillside, hoping that "
    "their roots would hold the soil in place when the heavy rains return in the coming winter months.",
    "The library extended its opening hours after students asked for a quiet place to study in the "
    "evenings, and the reading room is now full until ten o'clock on most weekday nights of the term.",
]


def page(i: int) -> tuple[bytes, str]:
    text = PARAS[i % len(PARAS)] + " " + PARAS[(i + 1) % len(PARAS)]
    html = (f"<html><head><title>Page {i}</title></head><body><nav>Home | About</nav>"
            f"<article><h1>Story {i}</h1><p>{text}</p></article><footer>(c) 2009</footer></body></html>")
    return html.encode(), text


def http_with(body: bytes, headers: dict[str, str], status: str = "200 OK", eol: str = "\r\n") -> bytes:
    head = f"HTTP/1.1 {status}{eol}" + "".join(f"{k}: {v}{eol}" for k, v in headers.items()) + eol
    return head.encode("latin-1") + body


def clueweb09(n: int = 5) -> tuple[bytes, int, list[str]]:
    """WARC/0.18 as in the ClueWeb09 sample: LF-only line ends, Content-Length counted before the
    CRs were stripped (so it is too large), non-ISO dates, one gzip stream for the whole file."""
    out, texts = [], []
    info = b"software: Nutch 1.0-dev\ncollection: clueweb09\n"
    out.append(b"WARC/0.18\nWARC-Type: warcinfo\nWARC-Date: 2009-03-65T08:43:19-0800\n"
               b"Content-Type: application/warc-fields\nContent-Length: %d\n\n" % (len(info) + 2) + info + b"\n")
    for i in range(n):
        body, text = page(i)
        http = http_with(body, {"Content-Type": "text/html"}, eol="\n")
        claimed = len(http) + http.count(b"\n")  # as if every LF had been CRLF
        out.append(b"WARC/0.18\nWARC-Type: response\nWARC-Target-URI: http://site%d.example.com/\n"
                   b"WARC-Date: 2009-03-65T08:43:19-0800\nWARC-TREC-ID: clueweb09-en0000-00-%05d\n"
                   b"Content-Type: application/http;msgtype=response\nWARC-Identified-Payload-Type: \n"
                   b"Content-Length: %d\n\n" % (i, i, claimed) + http + b"\n")
        texts.append(text)
    return gzip.compress(b"".join(out), mtime=0), n, texts


def heritrix_2008(n: int = 4) -> tuple[bytes, int, list[str]]:
    """WARC/0.17 records as a 2008 Heritrix crawl wrote them (one gzip member per record), one of
    them with its target URI in angle brackets."""
    w, texts = WarcBuilder(random.Random(1), date="2008-04-30T20:48:25Z"), []
    for i in range(n):
        body, text = page(i)
        uri = f"http://www.archive.example/{i}.html"
        kw = {"version": "WARC/0.17"}
        if i == 0:
            kw["extra"] = {"WARC-Target-URI": f"<{uri}>"}
        w.add("request", uri, b"GET / HTTP/1.0\r\n\r\n", "application/http; msgtype=request", **kw)
        w.add("response", uri, http_response(body), "application/http; msgtype=response", **kw)
        texts.append(text)
    return w.getvalue(), n, texts


def chunk(data: bytes, sizes=(17, 64)) -> bytes:
    out, pos, k = [], 0, 0
    while pos < len(data):
        size = sizes[k % len(sizes)]
        piece = data[pos:pos + size]
        out.append(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
        pos, k = pos + size, k + 1
    return b"".join(out) + b"0\r\n\r\n"


def encodings() -> tuple[bytes, int, list[str], dict[str, int]]:
    """Transfer-Encoding and Content-Encoding as different crawlers store them: on the wire, or
    decoded with the header kept; plus broken framing. Returns the expected counts too."""
    w, texts, cases = WarcBuilder(random.Random(2)), [], []
    bodies = [page(i) for i in range(10)]
    raw_deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    cases = [
        ({"Transfer-Encoding": "chunked"}, chunk(bodies[0][0])),
        ({"Transfer-Encoding": "chunked"}, bodies[1][0]),  # stored de-chunked, header kept
        ({"Transfer-Encoding": "chunked"}, b"7d72\r\n" + bodies[2][0]),  # framing broken: raw body kept
        ({"Content-Encoding": "gzip"}, gzip.compress(bodies[3][0], mtime=0)),
        ({"Content-Encoding": "deflate"}, zlib.compress(bodies[4][0])),
        ({"Content-Encoding": "deflate"}, raw_deflate.compress(bodies[5][0]) + raw_deflate.flush()),
        ({"Content-Encoding": "br"}, brotli.compress(bodies[6][0])),
        ({"Content-Encoding": "gzip"}, bodies[7][0]),  # stored decoded, header kept
        ({"Transfer-Encoding": "chunked", "Content-Encoding": "gzip"}, chunk(gzip.compress(bodies[8][0], mtime=0))),
        ({"Content-Encoding": "gzip"}, b"\x1f\x8b\x08\x00" + b"\x00" * 40),  # broken gzip: undecodable
    ]
    for i, (headers, body) in enumerate(cases):
        uri = f"https://enc.example.org/{i}"
        w.add("response", uri, http_with(body, {"Content-Type": "text/html; charset=utf-8", **headers}),
              "application/http; msgtype=response")
        if i != 2 and i != 9:
            texts.append(bodies[i][1])
    counts = {"dechunked": 2, "chunked_header_plain_body": 1, "chunked_framing_broken": 1, "content_decoded": 5,
              "encoding_header_plain_body": 1, "content_undecodable": 1}
    return w.getvalue(), len(cases), texts, counts


def languages() -> tuple[bytes, dict[str, str]]:
    """A Chinese page, a Japanese page, a Korean page and a short English page -> expected labels."""
    w = WarcBuilder(random.Random(3))
    pages = {
        "zh": "这是一个关于中国历史的网页。我们介绍了很多朝代的故事和人物，包括唐朝、宋朝和明朝的文化与艺术。" * 4,
        "ja": "これは日本の歴史についてのページです。平安時代や江戸時代の文化と芸術について説明します。" * 4,
        "ko": "이 페이지는 한국의 역사에 관한 내용입니다. 조선 시대의 문화와 예술에 대해 설명합니다." * 4,
        "unknown": "Welcome to our website. We sell garden tools.",
    }
    for lang, text in pages.items():
        html = f"<html><body><article><p>{text}</p></article></body></html>".encode()
        w.add("response", f"https://{lang}.example.org/", http_response(html), "application/http; msgtype=response")
    return w.getvalue(), {f"https://{k}.example.org/": k for k in pages}


def broken_tail() -> bytes:
    """A record whose Content-Length runs past the end of a CRLF file: a real truncation."""
    good = record_bytes("response", "https://t.example/", http_response(page(0)[0]), date="2020-01-01T00:00:00Z",
                        rng=random.Random(4), content_type="application/http; msgtype=response")
    cut = record_bytes("response", "https://t.example/2", http_response(page(1)[0]), date="2020-01-01T00:00:00Z",
                       rng=random.Random(5), content_type="application/http; msgtype=response")
    return gz(good) + gz(cut[:-300])[:-30]
