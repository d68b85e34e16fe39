"""HTML bytes -> UTF-8 -> main text -> language: the pieces of extraction, split by where they run.

`to_utf8` (and language ID, tasks.extract.langid) run in the stage's own process: they are
linear-time C codecs and a fixed-length language model, so they need no time limit. `extract_main_text` is the only part that
can spin on a pathological page, so it alone runs in the sandbox child (tasks.extract.sandbox); keeping the
child's work to exactly the extraction library's call keeps the critical path of a shard short
while the parent reads the next WARC records on the other core.

Kept free of heavy imports (no pyarrow, pydantic, pandas) so a child starts in a few ms.
"""
from __future__ import annotations

import codecs

UTF8 = "utf-8"


# The WHATWG Encoding Standard, which every browser follows, reads the labels iso-8859-1 (latin1, ...) and
# us-ascii as windows-1252: pages so labelled are written in it. Read as Latin-1, their curly quotes, apostrophes
# and dashes became C1 control characters (U+0092 for ’), which the filter counts as binary: dialogue-heavy pages
# were dropped, the others kept with the controls in their text.
_AS_BROWSERS_READ = {"iso8859-1": "cp1252", "ascii": "cp1252"}
_CP1252_UNASSIGNED = {0xDC00 + b: b for b in (0x81, 0x8D, 0x8F, 0x90, 0x9D)}


def to_utf8(body: bytes, declared: str | None) -> tuple[bytes, bool]:
    """(UTF-8 bytes, repaired): decode with the declared charset; if it is missing, unknown or
    wrong, try UTF-8, then detect. Valid UTF-8 is passed through without a copy. A body that is valid
    UTF-8 with non-ASCII characters is UTF-8 whatever it declares (servers label UTF-8 pages
    iso-8859-1 by default, and latin-1 decodes any bytes, so trusting it makes mojibake): legacy
    text practically never forms valid multi-byte UTF-8 sequences throughout. UTF-16/32 labels are trusted."""
    codec = None
    if declared:
        try:
            codec = codecs.lookup(declared).name
        except LookupError:
            pass
        codec = _AS_BROWSERS_READ.get(codec, codec)
    if codec is not None and codec != UTF8:
        if not codec.startswith(("utf-16", "utf-32")) and not body.isascii():
            try:
                body.decode(UTF8)
                return body, True  # mislabelled UTF-8
            except UnicodeDecodeError:
                pass
        if codec == "cp1252":  # as browsers: its 5 unassigned bytes are the C1 controls of the same value
            return body.decode(codec, "surrogateescape").translate(_CP1252_UNASSIGNED).encode(UTF8), False
        try:
            return body.decode(codec).encode(UTF8), False
        except UnicodeDecodeError:
            pass
    try:
        body.decode(UTF8)
        return body, declared is not None and codec != UTF8
    except UnicodeDecodeError:
        from resiliparse.parse.encoding import bytes_to_str, detect_encoding

        return bytes_to_str(body, detect_encoding(body)).encode(UTF8, "replace"), True


def extract_main_text(item: tuple[bytes, str]) -> str:
    """(UTF-8 HTML, extractor name) -> main text. The sandboxed step."""
    body, extractor = item
    if extractor == "trafilatura":
        import trafilatura

        text = trafilatura.extract(body.decode(UTF8), include_comments=False, include_tables=False) or ""
    else:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        text = extract_plain_text(HTMLTree.parse_from_bytes(body, UTF8), main_content=True, alt_texts=False,
                                  links=False, list_bullets=False)
    return text.strip()
