"""The heuristic rules, in datatrove / FineWeb's order: language, Gopher repetition, Gopher quality,
then C4's line rules (the only rules that edit a page). Each document gets the first rule it fails,
named `<group>.<rule>`; they apply to the datasets of FilterParams.rules_datasets, but for the groups a
dataset skips (FilterParams.exempt). Empty pages and pages of binary junk are dropped whatever the dataset."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.filter import textstats as ts
from tasks.filter.c4 import c4_lines
from tasks.filter.config import FilterParams

MAX_CONTROL_CHAR_RATIO = 0.01  # control characters and U+FFFD: decoded binary, never text


def _repetition_reasons(f: FilterParams) -> list[tuple[str, callable]]:
    r = f.gopher_repetition
    chars = lambda s: np.maximum(s[:, ts.CHARS], 1)  # noqa: E731
    rules = [
        ("dup_para_frac", lambda s: s[:, ts.DUP_PARAS] / np.maximum(s[:, ts.PARAS], 1) > r.dup_para_frac),
        ("dup_para_char_frac", lambda s: s[:, ts.DUP_PARA_CHARS] / chars(s) > r.dup_para_char_frac),
        ("dup_line_frac", lambda s: s[:, ts.DUP_LINES] / np.maximum(s[:, ts.NL_LINES], 1) > r.dup_line_frac),
        ("dup_line_char_frac", lambda s: s[:, ts.DUP_LINE_CHARS] / chars(s) > r.dup_line_char_frac),
    ]
    col = ts.N_FIXED
    for g in r.top_ngrams:
        rules.append((f"top_{g.n}_gram", lambda s, c=col, t=g.frac: s[:, c] / chars(s) > t))
        col += 1
    for g in r.dup_ngrams:
        rules.append((f"duplicated_{g.n}_n_grams", lambda s, c=col, t=g.frac: s[:, c] / chars(s) > t))
        col += 1
    return rules


def _quality_reasons(f: FilterParams) -> list[tuple[str, callable]]:
    q = f.gopher_quality
    words = lambda s: np.maximum(s[:, ts.WORDS], 1)  # noqa: E731
    tokens = lambda s: np.maximum(s[:, ts.TOKENS], 1)  # noqa: E731
    lines = lambda s: np.maximum(s[:, ts.LINES], 1)  # noqa: E731
    return [
        ("min_words", lambda s: s[:, ts.WORDS] < q.min_words),
        ("max_words", lambda s: s[:, ts.WORDS] > q.max_words),
        ("min_avg_word_length", lambda s: s[:, ts.WORD_CHARS] / words(s) < q.min_avg_word_length),
        ("max_avg_word_length", lambda s: s[:, ts.WORD_CHARS] / words(s) > q.max_avg_word_length),
        ("hash_ratio", lambda s: s[:, ts.HASHES] / tokens(s) > q.max_symbol_word_ratio),
        ("ellipsis_ratio", lambda s: s[:, ts.ELLIPSES] / tokens(s) > q.max_symbol_word_ratio),
        ("bullet_lines", lambda s: s[:, ts.BULLET_LINES] / lines(s) > q.max_bullet_lines_ratio),
        ("ellipsis_lines", lambda s: s[:, ts.ELLIPSIS_LINES] / lines(s) > q.max_ellipsis_lines_ratio),
        ("alpha_words", lambda s: s[:, ts.ALPHA_TOKENS] / tokens(s) < q.min_alpha_words_ratio),
        ("stop_words", lambda s: s[:, ts.STOP_WORDS] < q.min_stop_words),
    ]


def reason_names(f: FilterParams) -> list[str]:
    """Every reason a document can be dropped for, in the order rules run (index 0: kept)."""
    return (["", "empty", "binary", "language"]
            + [f"gopher_repetition.{n}" for n, _ in _repetition_reasons(f)]
            + [f"gopher_quality.{n}" for n, _ in _quality_reasons(f)]
            + ["c4.lorem_ipsum", "c4.curly_bracket", "c4.too_few_sentences", "classifier"])


def apply_rules(table: pa.Table, f: FilterParams) -> tuple[np.ndarray, list[str | None], int]:
    """(reason index per document, 0 = kept; the new text of each kept document that C4 edited, else
    None; lines C4 removed)."""
    names = reason_names(f)
    code = {n: i for i, n in enumerate(names)}
    n = table.num_rows
    reason = np.zeros(n, dtype=np.int16)
    texts = table.column("text")
    datasets = table.column("dataset").to_pylist()
    stats = ts.text_stats(texts, [g.n for g in f.gopher_repetition.top_ngrams], [g.n for g in f.gopher_repetition.dup_ngrams])
    groups = {d: set(f.groups_for(d)) for d in set(datasets)}
    applies = {g: np.array([g in groups[d] for d in datasets], dtype=bool) for g in ("language", "gopher_repetition",
                                                                                       "gopher_quality", "c4")}

    def mark(mask: np.ndarray, name: str) -> None:
        reason[(reason == 0) & mask] = code[name]

    visible = stats[:, ts.WORDS] + stats[:, ts.TOKENS]
    mark(visible == 0, "empty")
    mark(stats[:, ts.CONTROL_CHARS] > MAX_CONTROL_CHAR_RATIO * np.maximum(stats[:, ts.CHARS], 1), "binary")
    lang = np.array(table.column("lang").to_pylist(), dtype=object)
    score = table.column("lang_score").to_numpy(zero_copy_only=False)
    bad_lang = ~np.isin(lang, list(f.language.keep)) | (score < f.language.min_score)
    mark(applies["language"] & bad_lang, "language")
    for name, rule in _repetition_reasons(f):
        mark(applies["gopher_repetition"] & rule(stats), f"gopher_repetition.{name}")
    for name, rule in _quality_reasons(f):
        mark(applies["gopher_quality"] & rule(stats), f"gopher_quality.{name}")
    edited: list[str | None] = [None] * n
    removed = 0
    for i in np.flatnonzero((reason == 0) & applies["c4"]):
        text = texts[int(i)].as_py()
        new, why, r = c4_lines(text, f.c4)
        removed += r
        if new is None:
            reason[i] = code[why]
        elif new != text:
            edited[i] = new
    return reason, edited, removed
