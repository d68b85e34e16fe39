"""C4's line rules (Raffel et al. 2020; tensorflow_datasets c4_utils, as datatrove's C4QualityFilter):
lines are removed, and a page is dropped for 'lorem ipsum', a curly bracket, or too few sentences left.
Per line this is a handful of str methods, no tokenizer: sentences are counted as runs of . ! ? that
end a sentence, where C4 runs NLTK's punkt per line."""
from __future__ import annotations

import re

from tasks.filter.config import C4Lines

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s|$)")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


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
        sentences += max(1, len(SENTENCE_END.findall(line)))
        kept.append(line)
    if sentences < c.min_sentences:
        return None, "c4.too_few_sentences", removed
    return "\n".join(kept).strip(), "", removed
