"""Language identification: resiliparse's n-gram detector, with the writing system deciding where
it is the better evidence, and "unknown" rather than a guess on too little text.

- Confidence in [0, 1], higher is surer: 1 - distance / cutoff, where distance is resiliparse's
  out-of-place distance to the best language profile and cutoff (1200) the distance past which it
  answers "unknown". Long clean English scores about 0.5, a 60-character snippet about 0.3.
- Script first: text whose letters are mostly Hangul is `ko`; with Hiragana/Katakana among Han it
  is `ja`; mostly Han without either is `zh` (the n-gram profiles mislabel CJK pages, e.g. Chinese
  as Korean). Confidence there is the share of letters in that script.
- Below `min_chars` characters of text, or below `min_confidence`, the answer is `unknown`.
"""
from __future__ import annotations

import re

CUTOFF = 1200  # resiliparse detect_fast's default out-of-place cutoff

_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_LETTER = re.compile(r"[^\W\d_]")


def script_shares(text: str) -> dict[str, float]:
    """Share of letters that are Han, Kana and Hangul (other letters count in the total). Regexes,
    not a Python loop over characters: this runs on every document."""
    letters = len(_LETTER.findall(text)) if not text.isascii() else 0
    if not letters:
        return {"han": 0.0, "kana": 0.0, "hangul": 0.0}
    return {name: len(rx.findall(text)) / letters for name, rx in (("han", _HAN), ("kana", _KANA), ("hangul", _HANGUL))}


def _by_script(text: str) -> tuple[str, float] | None:
    s = script_shares(text)
    if s["hangul"] >= 0.3:
        return "ko", s["hangul"]
    if s["kana"] >= 0.05 and s["han"] + s["kana"] >= 0.3:
        return "ja", s["han"] + s["kana"]
    if s["han"] >= 0.3:
        return "zh", s["han"]
    return None


def detect_lang(text: str, n_chars: int, min_chars: int = 200, min_confidence: float = 0.1) -> tuple[str, float]:
    """(ISO 639-1 code or "unknown", confidence in [0, 1])."""
    sample = text[:n_chars]
    if len(sample.strip()) < min_chars:
        return "unknown", 0.0
    found = _by_script(sample)
    if found is not None:
        return found[0], round(found[1], 4)
    from resiliparse.parse.lang import detect_fast

    lang, distance = detect_fast(sample, cutoff=CUTOFF)
    confidence = max(0.0, 1.0 - distance / CUTOFF) if lang != "unknown" else 0.0
    if lang == "unknown" or confidence < min_confidence:
        return "unknown", round(confidence, 4)
    return lang, round(confidence, 4)
