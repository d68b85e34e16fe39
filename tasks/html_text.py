"""HTML bytes -> main text + language: the code that runs inside the extraction sandbox child.

Kept free of heavy imports (no pyarrow, pydantic, pandas) so a child starts in a few ms.
"""
from __future__ import annotations

import codecs


def decode_html(body: bytes, declared: str | None) -> tuple[str, bool]:
    """Decode with the declared charset; if it is missing, unknown or wrong, detect it."""
    if declared:
        try:
            return body.decode(codecs.lookup(declared).name), False
        except (LookupError, UnicodeDecodeError):
            pass
    try:
        return body.decode("utf-8"), declared is not None
    except UnicodeDecodeError:
        from resiliparse.parse.encoding import bytes_to_str, detect_encoding

        return bytes_to_str(body, detect_encoding(body)), True


def detect_lang(text: str, n_chars: int) -> tuple[str, float]:
    from resiliparse.parse.lang import detect_fast

    lang, score = detect_fast(text[:n_chars])
    return lang, float(score)


def extract_one(item: tuple) -> tuple[str, bool, str, float]:
    """(body, charset, extractor, lang_chars) -> (main text, encoding repaired, lang, lang score)."""
    body, charset, extractor, lang_chars = item
    html, repaired = decode_html(body, charset)
    if extractor == "trafilatura":
        import trafilatura

        text = trafilatura.extract(html, include_comments=False, include_tables=False) or ""
    else:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        text = extract_plain_text(HTMLTree.parse(html), main_content=True, alt_texts=False,
                                  links=False, list_bullets=False)
    text = text.strip()
    lang, score = detect_lang(text, lang_chars) if text else ("unknown", 0.0)
    return text, repaired, lang, score
