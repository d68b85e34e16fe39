"""HTML bytes -> UTF-8 -> main text -> language: the pieces of extraction, split by where they run.

`to_utf8`, `finished` (and language ID, tasks.extract.langid) run in the stage's own process: they are
linear-time C codecs, string replaces and a fixed-length language model, so they need no time limit.
`extract_main_text` is the only part that can spin on a pathological page, so it alone runs in the sandbox
child (tasks.extract.sandbox); keeping the child's work to the extraction library's call (and the one
regular expression that works around it) keeps the critical path of a shard short while the parent
reads the next WARC records on the other core.

Kept free of heavy imports (no pyarrow, pydantic, pandas) so a child starts in a few ms.
"""
from __future__ import annotations

import codecs
import html
import re
import unicodedata

UTF8 = "utf-8"


# The WHATWG Encoding Standard, which every browser follows, decodes these labels with a superset: pages so
# labelled are written in it. Read as Latin-1, their curly quotes, apostrophes and dashes became C1 control
# characters (U+0092 for ’), which the filter counts as binary; read as strict EUC-KR, Shift_JIS, GB2312 or Big5,
# a page with one character of the vendors' extensions (똠, ①, HKSCS) failed and went to detection.
_AS_BROWSERS_READ = {"iso8859-1": "cp1252", "ascii": "cp1252", "iso8859-9": "cp1254", "iso8859-11": "cp874",
                     "tis-620": "cp874", "shift_jis": "cp932", "euc_kr": "cp949", "gb2312": "gb18030",
                     "gbk": "gb18030", "big5": "big5hkscs", "utf-16": "utf-16-le"}
# WHATWG labels Python's codecs do not know
_WHATWG_ONLY = {"windows-31j": "cp932", "x-sjis": "cp932", "x-gbk": "gb18030", "x-euc-jp": "euc_jp",
                "x-mac-cyrillic": "mac-cyrillic", "x-mac-ukrainian": "mac-cyrillic", "x-mac-roman": "mac-roman",
                "dos-874": "cp874", "x-cp1250": "cp1250", "x-cp1251": "cp1251", "x-cp1252": "cp1252"}
_CP1252_UNASSIGNED = {0xDC00 + b: b for b in (0x81, 0x8D, 0x8F, 0x90, 0x9D)}
_BOMS = ((b"\xef\xbb\xbf", UTF8), (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"))
# the HTML prescan's two forms in the first 1024 bytes: <meta charset=x>, <meta http-equiv=... content="...; charset=x">
_META_CHARSET = re.compile(rb"<meta\b[^>]*?\bcharset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]+)", re.I)


def codec_of(label: str | bytes | None) -> str | None:
    """The Python codec a browser decodes a charset label with; None for no label or one that names no
    text encoding (browsers ignore those: "hex", "base64", "zip" are Python codecs, not charsets)."""
    if isinstance(label, bytes):
        label = label.decode("ascii", "replace")
    if not label:
        return None
    label = label.strip().lower()
    try:
        info = codecs.lookup(_WHATWG_ONLY.get(label, label))
    except (LookupError, ValueError):
        return None
    if not info._is_text_encoding or info.name.endswith(("escape", "punycode", "idna", "utf-7")):
        return None
    return _AS_BROWSERS_READ.get(info.name, info.name)


def _decode(body: bytes, codec: str, errors: str = "strict") -> bytes:
    if codec == "cp1252":  # as browsers: its 5 unassigned bytes are the C1 controls of the same value
        return body.decode(codec, "surrogateescape").translate(_CP1252_UNASSIGNED).encode(UTF8, "replace")
    return body.decode(codec, errors).encode(UTF8, "replace")


def to_utf8(body: bytes, declared: str | None) -> tuple[bytes, bool]:
    """(UTF-8 bytes, repaired), in a browser's order (WHATWG "decode" and HTML's prescan): a byte order mark,
    then the declared charset, then a <meta> charset; if none holds, UTF-8, then detection. Valid UTF-8 is
    passed through without a copy. A body that is valid UTF-8 with non-ASCII characters is UTF-8 whatever it
    declares (servers label UTF-8 pages iso-8859-1 by default, and latin-1 decodes any bytes, so trusting it
    makes mojibake): legacy text practically never forms valid multi-byte UTF-8 sequences throughout.
    UTF-16 labels are trusted. Repaired: the page's own labels did not give its text."""
    for bom, codec in _BOMS:
        if body.startswith(bom):
            return body[len(bom):].decode(codec, "replace").encode(UTF8), codec_of(declared) != codec
    codec = codec_of(declared)
    if codec is None and (meta := _META_CHARSET.search(body, 0, 1024)):
        codec = codec_of(meta.group(1))
        codec = None if codec is not None and codec.startswith(("utf-16", "utf-32")) else codec  # ASCII-read: not 16-bit
    if codec is not None and codec != UTF8:
        if not codec.startswith(("utf-16", "utf-32")) and not body.isascii():
            try:
                body.decode(UTF8)
                return body, True  # mislabelled UTF-8
            except UnicodeDecodeError:
                pass
        try:
            return _decode(body, codec), False
        except UnicodeError:
            pass
    try:
        body.decode(UTF8)
        return body, declared is not None and codec != UTF8
    except UnicodeDecodeError:
        pass
    from resiliparse.parse.encoding import detect_encoding

    # uchardet's own name: resiliparse's WHATWG table knows no "cp949"/"uhc" and answered utf-8 for Korean
    found = codec_of(detect_encoding(body, html5_compatible=False)) or "cp1252"
    if found == UTF8:  # UTF-8 with a stray byte (or cut mid-character): one U+FFFD
        return body.decode(UTF8, "replace").encode(UTF8), True
    return _decode(body, found, "replace"), True


# resiliparse (2.0.1) drops a text node of one 3-byte UTF-8 character as an icon font's private-use glyph: its
# check compares the bytes in the wrong order, so `<span>€</span>25` gave "25", `<a>10</a>–<a>20</a>` "1020",
# `東京</a>、<a>大阪` "東京大阪", and as entities (WooCommerce's `&euro;`, WordPress's `&#8211;`) the same. Such
# a character, raw or an entity, gets a WORD JOINER after it, removed again from the text; not a private-use
# one (U+E000-U+F8FF: the icons) nor an invisible one (a `<p>&#8203;</p>` spacer stays dropped: kept, it
# made a clean page's paragraphs repeat for Gopher's rule).
_LONE_CHARACTER = re.compile(rb">[ \t\r\n]*+([\xe0-\xef][\x80-\xbf]{2}|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});)"
                             rb"(?=[ \t\r\n]*+<)")  # (possessive: 17 us a 24 KB page, not 21)
_JOINER = "\u2060"
_INVISIBLE = {"Zs", "Zl", "Zp", "Cf", "Cc", "Cs", "Co", "Cn"}


def _marked(m: re.Match) -> bytes:
    token = m.group(1)
    ch = html.unescape(token.decode("ascii")) if token[:1] == b"&" else token.decode(UTF8, "replace")
    if len(ch) == 1 and 0x800 <= ord(ch) <= 0xFFFF and unicodedata.category(ch) not in _INVISIBLE:
        return m.group(0) + _JOINER.encode(UTF8)
    return m.group(0)
# elements whose text is not the page's: with alt_texts=False resiliparse also skipped <figure>, and with it
# every WordPress block table, pull quote and highlighted code block. Comment sections by their usual names
# (WordPress): resiliparse's comments=False drops any element with a `comment` class token, and so a
# whole post filed under "Comment" (`category-comment`) or a `content-with-comments` wrapper
_NO_TEXT = ["img", "area", "svg", "object", "video", "audio", "embed"]
_COMMENT_SECTIONS = _NO_TEXT + ["#comments", ".comments-area", "#respond", ".comment-list", ".commentlist",
                                "#commentform"]  # (id and class selectors cost resiliparse ~25%: where named only)


def for_extraction(body: bytes, extractor: str) -> bytes:
    """The UTF-8 page as the extraction library is given it: for resiliparse, lone characters marked (above).
    In the child, beside the library's call: in the stage's process, the busier one, it cost 20% of the stage."""
    if extractor == "trafilatura":
        return body
    return _LONE_CHARACTER.sub(_marked, body)


def extract_main_text(item: tuple[bytes, str]) -> str:
    """(UTF-8 HTML, extractor name) -> main text, without comment sections: the sandboxed step (the
    library's call, after for_extraction). `finished` completes the text in the stage's process."""
    body, extractor = item
    if extractor == "trafilatura":
        import trafilatura

        return trafilatura.extract(body.decode(UTF8), include_comments=False) or ""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    body = for_extraction(body, extractor)
    # the comment sections skipped (_COMMENT_SECTIONS): a WordPress post ended in its comments (spam among them)
    # and "Leave a Reply". WordPress's #respond form sits in its #comments; Disqus's thread is loaded by script
    named = b"comment" in body
    return extract_plain_text(HTMLTree.parse_from_bytes(body, UTF8), main_content=True, alt_texts=True,
                              skip_elements=_COMMENT_SECTIONS if named else _NO_TEXT, links=False, list_bullets=False)


def finished(text: str) -> str:
    """The extracted text without the marks for_extraction added and soft hyphens (&shy; split
    "Bundes\xadregierung" for search, filters and the tokenizer)."""
    return text.replace(_JOINER, "").replace("\u00ad", "").strip()


def main_text(body: bytes, extractor: str) -> str:
    """UTF-8 HTML -> main text, both steps in this process."""
    return finished(extract_main_text((body, extractor)))
