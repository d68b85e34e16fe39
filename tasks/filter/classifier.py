"""The quality classifier of GPT-3 (App. A): hashed word n-gram features (scikit-learn's
HashingVectorizer) and logistic regression, trained on curated documents (positives) against raw
crawl (unlabeled: good pages and junk), and GPT-3's sampling: a crawl document is kept when
pareto(alpha) > 1 - score.

The model is saved as a .npz of plain arrays (weights, intercept, calibration, settings as JSON) and
loaded with allow_pickle=False: loading it runs no code, unlike a pickled scikit-learn estimator."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xxhash

from tasks.core.errors import ConfigError
from tasks.core.passes import savez

FORMAT = 1


def vectorizer(n_features: int, ngram: int):
    from sklearn.feature_extraction.text import HashingVectorizer

    # GPT-3 used Spark's HashingTF; l2-normalised term counts keep long pages from dominating
    return HashingVectorizer(n_features=n_features, ngram_range=(1, ngram), alternate_sign=False, norm="l2",
                             lowercase=True, dtype=np.float32)


class QualityModel:
    def __init__(self, coef: np.ndarray, intercept: float, scale: float, meta: dict):
        self.coef, self.intercept, self.scale, self.meta = coef.astype(np.float32), float(intercept), float(scale), meta
        self._vec = vectorizer(int(meta["n_features"]), int(meta["ngram"]))

    def raw(self, texts: list[str]) -> np.ndarray:
        """The logistic regression's probability that a text is from the curated sets."""
        if not texts:
            return np.zeros(0, dtype=np.float64)
        z = self._vec.transform(texts) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-z.astype(np.float64)))

    def score(self, texts: list[str]) -> np.ndarray:
        """Quality in [0, 1]: the probability divided by its mean on held-out positives (Elkan-Noto), capped at 1."""
        return np.minimum(1.0, self.raw(texts) / self.scale)

    def save(self, path: Path) -> None:
        with open(path, "wb") as fh:
            savez(fh, coef=self.coef, intercept=np.float64(self.intercept), scale=np.float64(self.scale),
                  meta=np.frombuffer(json.dumps(self.meta, sort_keys=True).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: str | Path) -> "QualityModel":
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                model = cls(z["coef"], float(z["intercept"]), float(z["scale"]), meta)
        except (OSError, KeyError, ValueError) as e:
            raise ConfigError(f"filter.classifier.model_path: {path} is not a quality model ({e})") from e
        if meta.get("format") != FORMAT or len(model.coef) != meta.get("n_features"):
            raise ConfigError(f"filter.classifier.model_path: {path} has format {meta.get('format')}, expected {FORMAT}")
        return model


def train(pos: list[str], neg: list[str], held_pos: list[str], held_neg: list[str], c,
          held_neg_scored: list[str] | None = None) -> tuple[QualityModel, dict]:
    """Fit on (pos, neg); the held-out documents give the AUC and the calibration constant. `held_neg_scored`:
    the held-out negatives the rules kept, the pages the classifier will score. The AUC against every held-out
    negative counts the empty, foreign and spam pages the rules already drop, easy ones (0.74 on a 600-page sample,
    where it is 0.59 against the pages it scores: classifier_auc_scored)."""
    from sklearn.linear_model import LogisticRegression

    vec = vectorizer(c.n_features, c.ngram)
    x = vec.transform(pos + neg)
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    lr = LogisticRegression(C=c.C, max_iter=2000, solver="lbfgs").fit(x, y)
    meta = {"format": FORMAT, "n_features": c.n_features, "ngram": c.ngram, "C": c.C, "calibration": c.calibration,
            "train_positives": len(pos), "train_negatives": len(neg)}
    model = QualityModel(lr.coef_[0], lr.intercept_[0], 1.0, meta)
    p_pos, p_neg = model.raw(held_pos), model.raw(held_neg)
    if c.calibration == "elkan_noto":
        if not len(p_pos):
            raise ConfigError("filter.classifier.calibration: elkan_noto needs held-out positive documents, got none")
        model.scale = float(p_pos.mean())
    auc = _auc(p_pos, p_neg)
    auc_scored = _auc(p_pos, model.raw(held_neg_scored)) if held_neg_scored is not None else None
    model.meta.update(scale=model.scale, heldout_auc=auc, heldout_auc_scored=auc_scored, heldout_positives=len(p_pos),
                      heldout_negatives=len(p_neg))
    return model, {"classifier_auc": auc, "classifier_auc_scored": auc_scored, "classifier_scale": round(model.scale, 6),
                   "classifier_train_docs": len(pos) + len(neg), "classifier_train_positives": len(pos),
                   "classifier_train_negatives": len(neg), "classifier_heldout_docs": len(p_pos) + len(p_neg)}


def _auc(p_pos: np.ndarray, p_neg: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score
    if not len(p_pos) or not len(p_neg):
        return None
    return float(roc_auc_score(np.r_[np.ones(len(p_pos)), np.zeros(len(p_neg))], np.r_[p_pos, p_neg]))


def unit(seed: int, ids: list[str], salt: str) -> np.ndarray:
    """A uniform number in [0, 1) per document id: the same for a document wherever it is sharded."""
    return np.array([(xxhash.xxh64_intdigest(f"{salt}:{i}".encode(), seed) >> 11) / 2.0 ** 53 for i in ids], dtype=np.float64)


def pareto_keep(scores: np.ndarray, u: np.ndarray, alpha: float) -> np.ndarray:
    """GPT-3: keep when np.random.pareto(alpha) > 1 - score; pareto(a) = (1 - u)^(-1/a) - 1 for u in [0, 1)."""
    with np.errstate(over="ignore"):  # a tiny alpha draws infinities: kept
        return (1.0 - u) ** (-1.0 / alpha) - 1.0 > 1.0 - scores
