"""params.yaml `filter`: heuristic rules (language, Gopher quality and repetition, C4 lines), then a
quality classifier trained on the curated datasets against raw crawl text, sampled as GPT-3 did."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.core.strict import PathText, Strict
from tasks.extract.langid import LABELS

RULE_GROUPS = ("language", "gopher_repetition", "gopher_quality", "c4")


class LanguageRule(Strict):
    keep: list[str] = Field(["en"], description="Languages kept: labels as the extract stage's `lang` (fastText "
                                                "lid.176's: en, de, zh, ceb, ...), or unknown.")
    min_score: float = Field(0.0, ge=0, le=1, description="Lowest language-ID confidence kept.")

    @model_validator(mode="after")
    def _codes(self):
        if not self.keep:  # every document would be dropped, and the stages after it run on nothing
            raise ValueError("keep: empty, which drops every document: list the languages to keep (e.g. [en])")
        bad = [k for k in self.keep if k not in LABELS and k != "unknown"]
        if bad:  # 'english', 'EN' or 'eng' would silently keep nothing
            raise ValueError(f"keep: {bad[0]!r} is not a language extract labels documents with (lid.176's labels: "
                             f"en, de, zh, ceb, ...; or unknown)")
        return self


class GopherQuality(Strict):
    """Gopher (Rae et al. 2021, App. A) quality rules; defaults as the paper and datatrove."""

    min_words: int = Field(50, ge=0, description="Fewer words: dropped.")
    max_words: int = Field(100_000, ge=1, description="More words: dropped.")
    min_avg_word_length: float = Field(3.0, ge=0, description="Shorter mean word length: dropped.")
    max_avg_word_length: float = Field(10.0, ge=0, description="Longer mean word length: dropped.")
    max_symbol_word_ratio: float = Field(0.1, ge=0, description="'#' or ellipses per word.")
    max_bullet_lines_ratio: float = Field(0.9, ge=0, le=1,
                                          description="Larger share of lines starting with a bullet: dropped.")
    max_ellipsis_lines_ratio: float = Field(0.3, ge=0, le=1,
                                            description="Larger share of lines ending in an ellipsis: dropped.")
    min_alpha_words_ratio: float = Field(0.8, ge=0, le=1, description="Share of words with an alphabetic character.")
    min_stop_words: int = Field(2, ge=0, le=8, description="Distinct stop words (the, be, to, of, and, that, have, with).")

    @model_validator(mode="after")
    def _ranges(self):
        for low, high in (("min_words", "max_words"), ("min_avg_word_length", "max_avg_word_length")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} {getattr(self, low)} exceeds {high} {getattr(self, high)}: every document would be dropped")
        return self


class NgramFrac(Strict):
    n: int = Field(ge=1, le=32, description="N-gram length in words.")
    frac: float = Field(ge=0, le=1, description="Largest character share of the most frequent n-gram.")


class GopherRepetition(Strict):
    """Gopher repetition rules (Table A1): fractions above which a document is dropped."""

    dup_line_frac: float = Field(0.3, ge=0, le=1, description="Share of lines that are duplicates.")
    dup_para_frac: float = Field(0.3, ge=0, le=1, description="Share of paragraphs that are duplicates.")
    dup_line_char_frac: float = Field(0.2, ge=0, le=1, description="Share of characters in duplicate lines.")
    dup_para_char_frac: float = Field(0.2, ge=0, le=1, description="Share of characters in duplicate paragraphs.")
    top_ngrams: list[NgramFrac] = Field(
        [NgramFrac(n=2, frac=0.2), NgramFrac(n=3, frac=0.18), NgramFrac(n=4, frac=0.16)],
        description="Largest character share of the most frequent n-gram.")
    dup_ngrams: list[NgramFrac] = Field(
        [NgramFrac(n=n, frac=f) for n, f in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))],
        description="Largest character share of repeated n-grams.")


class C4Lines(Strict):
    """C4 (Raffel et al. 2020) line rules: lines are removed, pages with too few sentences left dropped."""

    terminal_punctuation: bool = Field(True, description="Keep only lines ending in . ? ! \" ' (not an ellipsis).")
    min_words_per_line: int = Field(3, ge=0, description="Lines with fewer words are removed.")
    max_word_length: int = Field(1000, ge=1, description="Lines with a longer word are removed.")
    min_sentences: int = Field(5, ge=0, description="Pages with fewer sentences left are dropped.")
    lorem_ipsum: bool = Field(True, description="Drop pages containing 'lorem ipsum'.")
    javascript: bool = Field(True, description="Remove lines mentioning javascript.")
    curly_bracket: bool = Field(True, description="Drop pages containing '{'.")
    policy: bool = Field(True, description="Remove cookie / terms-of-use / privacy-policy lines.")
    remove_citations: bool = Field(True, description="Strip [1], [edit], [citation needed].")


class ClassifierParams(Strict):
    """GPT-3 App. A: hashed word n-gram features, logistic regression, Pareto sampling of the crawl."""

    enabled: bool = Field(True, description="Score and drop by the quality classifier (off: rules only).")
    positives: list[str] = Field(["Wikipedia (en)", "StackExchange"],
                                 description="High-quality datasets: the positive examples.")
    negatives: list[str] = Field(["common-crawl"], description="Raw crawl datasets: the negatives, and what is scored.")
    model_path: PathText = Field("", description="A model.npz trained earlier: used as is instead of training one.")
    n_features: int = Field(1 << 18, ge=16, le=1 << 24, description="Hashed feature space (a power of two).")
    ngram: int = Field(2, ge=1, le=3, description="Word n-grams 1..ngram.")
    C: float = Field(0.01, gt=0, description="Inverse L2 regularisation of the logistic regression.")
    max_train_docs: int = Field(100_000, ge=2, description="Per class, drawn with seed.")
    holdout: float = Field(0.2, gt=0, lt=1, description="Held out for the AUC and the positive-label rate.")
    # Raw crawl contains good pages too: it is unlabeled, not negative. Elkan & Noto (2008): a classifier of
    # labeled-vs-unlabeled outputs c * P(good), c = its mean output on held-out positives; dividing by c gives
    # P(good). Without it a crawl page that reads like the curated sets scores ~P/(P+N_good) and alpha 9 drops it.
    calibration: Literal["elkan_noto", "none"] = Field(
        "elkan_noto", description="elkan_noto: score = min(1, p / mean p of held-out positives); none: p as is.")
    alpha: float = Field(9.0, gt=0, description="Kept when pareto(alpha) > 1 - score (GPT-3: 9).")
    seed: int = Field(1234, ge=0, description="Seed of the classifier's training.")
    min_kept: float = Field(0.02, ge=0, le=1, description="Fewer kept of a scored dataset fails the stage's suite.")
    max_kept: float = Field(0.99, ge=0, le=1, description="More kept of a scored dataset fails the stage's suite.")
    min_scored_docs: int = Field(100, ge=0, description="The kept-fraction bounds apply to datasets with at least "
                                                        "this many scored documents (a tiny crawl may keep all).")

    @model_validator(mode="after")
    def _check(self):
        if self.n_features & (self.n_features - 1):
            raise ValueError(f"n_features must be a power of two, got {self.n_features}")
        both = sorted(set(self.positives) & set(self.negatives))
        if both:
            raise ValueError(f"datasets both positive and negative: {', '.join(both)}")
        if self.min_kept > self.max_kept:
            raise ValueError("min_kept exceeds max_kept")
        return self


class FilterParams(Strict):
    input_stage: Literal["extract"] = Field("extract", description="Stage whose shards are filtered.")
    language: LanguageRule = Field(LanguageRule(), description="The language rule.")
    gopher_quality: GopherQuality = Field(GopherQuality(), description="Gopher's quality rules.")
    gopher_repetition: GopherRepetition = Field(GopherRepetition(), description="Gopher's repetition rules.")
    c4: C4Lines = Field(C4Lines(), description="C4's line rules.")
    # Web-page rules: Gopher applied them to MassiveWeb only, C4's are for web text, and MT-NLG filtered the
    # crawl alone. Applied to the Pile they dropped every Github, ArXiv and PubMed document (alpha words) and
    # every book over Gopher's 100,000 words (Books3, PG-19).
    rules_datasets: list[str] = Field(
        ["common-crawl"], description="Datasets the rules apply to (the crawl); the others pass as they are, but for "
                                      "empty and binary pages.")
    exempt: dict[str, list[Literal["language", "gopher_repetition", "gopher_quality", "c4"]]] = Field(
        {}, description="Dataset -> rule groups it skips, of rules_datasets (a crawl of code pages fails C4's braces).")
    classifier: ClassifierParams = Field(
        ClassifierParams(), description="The quality classifier (GPT-3's, trained on the curated datasets).")
    batch_docs: int = Field(1000, ge=1, le=100_000, description="Documents per batch.")

    def groups_for(self, dataset: str) -> tuple[str, ...]:
        if dataset not in self.rules_datasets:
            return ()
        skip = set(self.exempt.get(dataset, ()))
        return tuple(g for g in RULE_GROUPS if g not in skip)
