"""Language ID (tasks/extract/langid.py) on real sentences: Article 1 of the Universal Declaration of
Human Rights in its official translations, the classic language-ID test text."""
import json
import random

import pytest

from tasks.extract import fasttext_lid
from tasks.extract.langid import LABELS, _model, detect_lang, model_path

UDHR_1 = {
    "en": "All human beings are born free and equal in dignity and rights. They are endowed with reason and "
          "conscience and should act towards one another in a spirit of brotherhood.",
    "de": "Alle Menschen sind frei und gleich an Würde und Rechten geboren. Sie sind mit Vernunft und Gewissen "
          "begabt und sollen einander im Geist der Brüderlichkeit begegnen.",
    "fr": "Tous les êtres humains naissent libres et égaux en dignité et en droits. Ils sont doués de raison et de "
          "conscience et doivent agir les uns envers les autres dans un esprit de fraternité.",
    "es": "Todos los seres humanos nacen libres e iguales en dignidad y derechos y, dotados como están de razón y "
          "conciencia, deben comportarse fraternalmente los unos con los otros.",
    "pt": "Todos os seres humanos nascem livres e iguais em dignidade e em direitos. Dotados de razão e de "
          "consciência, devem agir uns para com os outros em espírito de fraternidade.",
    "ru": "Все люди рождаются свободными и равными в своем достоинстве и правах. Они наделены разумом и совестью "
          "и должны поступать в отношении друг друга в духе братства.",
    "hi": "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है। उन्हें बुद्धि और "
          "अन्तरात्मा की देन प्राप्त है और परस्पर उन्हें भाईचारे के भाव से बर्ताव करना चाहिए।",
    "ar": "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق. وهم قد وهبوا عقلاً وضميرًا وعليهم أن يعامل بعضهم "
          "بعضًا بروح الإخاء.",
    "zh": "人人生而自由，在尊严和权利上一律平等。他们赋有理性和良心，并应以兄弟关系的精神相对待。",
    "ja": "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。人間は、理性と良心とを"
          "授けられており、互いに同胞の精神をもって行動しなければならない。",
    "ko": "모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다. 인간은 천부적으로 이성과 양심을 "
          "부여받았으며 서로 형제애의 정신으로 행동하여야 한다.",
}


@pytest.mark.parametrize("lang", sorted(UDHR_1))
def test_each_language_is_named_with_high_confidence(lang):
    # Hindi was Marathi or Nepali, Chinese Korean, to the n-gram detector used before
    got, score = detect_lang(UDHR_1[lang], 5000, min_chars=20)
    assert (got, score > 0.8) == (lang, True), (got, score)


def test_too_short_or_unsure_is_unknown_not_a_guess():
    assert detect_lang("Welcome to our website.", 5000, min_chars=200) == ("unknown", 0.0)
    assert detect_lang(" \n\t " * 100, 5000, min_chars=200) == ("unknown", 0.0)
    lang, score = detect_lang("1234 5678 !!! ??? -- " * 20, 5000, min_chars=200)  # no language at all
    assert lang == "unknown" and 0.0 <= score < 0.5
    # the same text is a guess below the cut and an answer above it: the cut decides, the score is kept
    text = "Welcome to our website. We sell garden tools. " * 6
    lang, score = detect_lang(text, 5000, min_chars=200, min_confidence=0.0)
    assert lang == "en" and 0.0 < score <= 1.0
    assert detect_lang(text, 5000, min_chars=200, min_confidence=min(1.0, score + 0.01)) == ("unknown", score)


def test_only_the_first_n_chars_are_read():
    mixed = UDHR_1["en"] + " " + UDHR_1["de"] * 20
    assert detect_lang(mixed, len(UDHR_1["en"]), min_chars=20)[0] == "en"
    assert detect_lang(mixed, 5000, min_chars=20)[0] == "de"


def test_text_the_model_cannot_take_as_it_is():
    shouted = "BREAKING NEWS: THE CITY COUNCIL APPROVED THE NEW BUDGET FOR SCHOOLS AND ROADS ON MONDAY NIGHT. " * 3
    assert detect_lang(shouted, 5000, min_chars=20)[0] == "en"  # upper case alone reads as Japanese or Chinese
    # one lower-case letter anywhere (a time, a unit, a URL) kept a shouted page upper case: Esperanto at 0.87
    notice = ("IMPORTANT NOTICE TO ALL TENANTS: THE WATER SUPPLY WILL BE SHUT OFF ON MONDAY FROM 9am TO 5pm FOR "
              "MAINTENANCE OF THE MAIN PIPES. PLEASE STORE ENOUGH WATER FOR YOUR NEEDS. WE APOLOGISE FOR ANY INCONVENIENCE.")
    assert detect_lang(notice, 5000, min_chars=20)[0] == "en"
    assert detect_lang(shouted + " see www.example.com", 5000, min_chars=20)[0] == "en"
    lines = UDHR_1["fr"].replace(". ", ".\n\n").replace(", ", ",\r\n")
    assert detect_lang(lines, 5000, min_chars=20)[0] == "fr"  # fastText's predict refuses a newline
    for odd in ("\ud800", "\x00", "\u2028", "\ufeff"):  # a lone surrogate cannot be passed to C++ as UTF-8
        lang, score = detect_lang(UDHR_1["es"] + odd + UDHR_1["es"], 5000, min_chars=20)
        assert lang == "es" and 0.0 <= score <= 1.0


def test_labels_are_every_label_of_the_model():
    """LABELS is what `lang` can hold and what filter.language.keep may name: the model's own list."""
    assert set(_model().labels) == LABELS and len(LABELS) == 176


def _fasttexts_answer(oracle, line: str) -> tuple[str, float]:
    """fastText's own predict, in fasttext_lid.predict's form (no prediction: unknown, 0)."""
    labels, probs = oracle.predict(line, k=1)
    return (labels[0].removeprefix("__label__"), float(probs[0])) if labels else ("unknown", 0.0)


def _fuzz(rng: random.Random) -> str:
    """Characters of 1 to 4 UTF-8 bytes, fastText's separators, its end-of-line word and label prefix."""
    pieces = [" ", " ", "\t", "\r", "\v", "\f", "\x00", "\u00a0", "</s>", "__label__", "__label__de", "<", ">"]
    ranges = [(0x21, 0x7E), (0xA0, 0x24F), (0x370, 0x4FF), (0x600, 0x6FF), (0x900, 0x97F), (0x3040, 0x30FF),
              (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1F64F), (0x10000, 0x1007F)]
    out = []
    for _ in range(rng.randint(0, 120)):
        if rng.random() < 0.2:
            out.append(rng.choice(pieces))
        else:
            lo, hi = rng.choice(ranges)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9))))
    return "".join(out)


def test_the_compiled_predictor_gives_fasttexts_label_and_probability_to_the_bit(benchmarks_dir):
    """tasks/extract/fasttext_lid.py against fastText's own predict (the fasttext-predict wheel): real
    passages of every length, the UDHR sentences, and fuzz of every kind of character."""
    import fasttext

    oracle = fasttext.load_model(str(model_path()))
    rng = random.Random(7)
    texts = list(UDHR_1.values())
    with (benchmarks_dir / "boolq/dev.jsonl").open() as f:
        texts += [json.loads(line)["passage"][: rng.randint(1, 3000)] for _, line in zip(range(600), f)]
    with (benchmarks_dir / "hellaswag/hellaswag_val.jsonl").open() as f:
        texts += [json.loads(line)["ctx"] for _, line in zip(range(300), f)]
    texts += [_fuzz(rng) for _ in range(1500)]
    texts += ["", " ", "\x00", "</s> tail not read", "__label__en", "x" * 5000]
    for text in texts:
        line = text.replace("\n", " ")
        assert fasttext_lid.predict(_model(), line) == _fasttexts_answer(oracle, line), repr(line[:80])


def test_model_files_unlike_lid176(tmp_path):
    """Valid fastText files that lid.176 is not: one whose vocabulary lacks "</s>" is read as fastText
    reads it (a literal "</s>" still ends the line, its n-grams never count); one whose n-gram buckets
    were not pruned is refused, not misread (every n-gram would have been dropped)."""
    import fasttext

    data = bytearray(model_path().read_bytes())
    assert data[92:97] == b"</s>\0"  # after the header, the args and size/nwords/nlabels/ntokens/prune_size
    data[92:96] = b"<s/>"
    no_eos = tmp_path / "no_eos.ftz"
    no_eos.write_bytes(bytes(data))
    oracle, ours = fasttext.load_model(str(no_eos)), fasttext_lid.load(no_eos)
    for text in ["puedes hablar", "</s>", "</s> y", "x </s> y", "</s>x", "hola </s> world world world", ""]:
        assert fasttext_lid.predict(ours, text) == _fasttexts_answer(oracle, text), text
    data[84:92] = (-1).to_bytes(8, "little", signed=True)
    unpruned = tmp_path / "unpruned.ftz"
    unpruned.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="n-gram buckets were not pruned is not supported"):
        fasttext_lid.load(unpruned)


def test_a_chinese_or_japanese_paragraph_is_long_enough_where_its_english_version_is():
    """lang_min_chars counted code points: the same news paragraph passed at 205 characters in English and was
    'unknown' at 93 in Chinese and 104 in Japanese, which lid.176 names at 0.999; a wide character counts three."""
    zh = ("市议会周二在就学校经费和道路维修进行长时间辩论后批准了新的预算。参加会议的居民表示，他们很高兴图书馆周末将继续开放。"
          "市长说，新的预算将优先考虑公共交通和社区服务，并将在明年春季开始实施。")
    ja = ("市議会は火曜日、学校の予算と道路の補修について長い議論を行った後、新しい予算案を承認しました。"
          "会議に出席した住民は、図書館が週末も開館し続けることを喜んでいると話しました。市長は来年の春から実施すると述べた。")
    assert len(zh) < 100 and len(ja) < 110
    assert detect_lang(zh, 1000, min_chars=200)[0] == "zh" and detect_lang(ja, 1000, min_chars=200)[0] == "ja"
    assert detect_lang(zh[:60], 1000, min_chars=200) == ("unknown", 0.0)  # still too short for a guess
