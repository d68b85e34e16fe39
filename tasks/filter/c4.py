"""C4's line rules (Raffel et al. 2020; tensorflow_datasets c4_utils, as datatrove's C4QualityFilter):
lines are removed, and a page is dropped for 'lorem ipsum', a curly bracket, or too few sentences left.
Per line this is a handful of str methods, no tokenizer. Sentences are counted as spaCy's sentencizer
counts them (datatrove's C4QualityFilter; C4 ran NLTK's punkt): a word ending in ! or ?, or in one
period that is not an abbreviation's ("U.S.", "Mr.", "J."; tokens.keeps_period: not "$3.99." or
"example.com."), ends one, so does a period between a lower-case and an upper-case letter ("costs.So"),
and words after the last end are one more. On 6,578 kept lines of LAMBADA, BoolQ and RACE the counts
equal spaCy's on 98.2% (runs of . ! ?: 86.5%)."""
from __future__ import annotations

import bisect
import re

import numpy as np

from tasks.filter.config import C4Lines
from tasks.filter.tokens import keeps_period

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
SENTENCE_RUN = re.compile("([.!?]+)[\"'\u201d\u2019)\\]\u00bb]*(?=\\s|$)")  # the scan C4 counting always did
SENTENCE_INFIX = re.compile(r"[a-z]\.(?=[A-Z])(?![A-Z]\.(?:\s|$))")  # "costs.So", not "Ph.D."
SPACE = re.compile(r"\s")
OPENING = "\"'\u201c\u2018(["
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


def count_sentences(line: str) -> int:
    """Sentences in one line, as the module's doc says (at least 1)."""
    n, last, spaces = len(SENTENCE_INFIX.findall(line)), 0, None
    for m in SENTENCE_RUN.finditer(line):
        run = m.group(1)
        if "!" not in run and "?" not in run:  # periods only: an ellipsis, or an abbreviation's?
            if len(run) > 1:
                continue
            # the word runs back to the last whitespace of any kind: back to the last ASCII space, a word after a
            # no-break space or a tab reached into the sentence before, held its period and read as an abbreviation
            if spaces is None:
                spaces = [w.start() for w in SPACE.finditer(line)]
            k = bisect.bisect_left(spaces, m.start())
            word = line[spaces[k - 1] + 1 if k else 0:m.start()].lstrip(OPENING)
            if word and keeps_period(np.fromiter(map(ord, word), np.int64, len(word)), 0, len(word)):
                continue  # an abbreviation's period, as the statistics' tokens keep it ("U.S.", "Mr.", "J.")
        n, last = n + 1, m.end()
    return max(1, n + any(ch.isalnum() for ch in line[last:]))


def c4_lines(text: str, c: C4Lines) -> tuple[str | None, str, int]:
    """(the text with its failing lines removed, or None if the page is dropped; the reason; lines removed)."""
    kept, sentences, removed = [], 0, 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        words = line.split()
        if max(map(len, words)) > c.max_word_length:
            removed += 1
            continue
        if c.remove_citations and "[" in line:
            line = CITATION.sub("", line)
        if c.terminal_punctuation and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
            removed += 1
            continue
        if len(words) < c.min_words_per_line:
            removed += 1
            continue
        low = line.lower()
        if c.lorem_ipsum and "lorem ipsum" in low:
            return None, "c4.lorem_ipsum", removed
        if c.javascript and "javascript" in low:
            removed += 1
            continue
        if c.curly_bracket and "{" in line:
            return None, "c4.curly_bracket", removed
        if c.policy and ("cookie" in low or "terms of use" in low or "privacy policy" in low) \
                and any(p in low for p in POLICY):
            removed += 1
            continue
        sentences += count_sentences(line)
        kept.append(line)
    if sentences < c.min_sentences or not kept:  # no line left: with min_sentences 0 the page was kept as ""
        return None, "c4.too_few_sentences", removed
    return "\n".join(kept).strip(), "", removed
