"""params.yaml `dedup`: exact then fuzzy (MinHash + LSH) document deduplication across all datasets,
keeping from each group of duplicates the copy from the highest-priority dataset (MT-NLG)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.core.strict import Strict


class DedupParams(Strict):
    """Exact dedup of normalised text, then MinHash LSH candidates, exact-Jaccard verification and
    connected components; each group keeps one document, chosen by dataset priority."""

    input_stage: Literal["extract", "filter"] = Field("filter", description="Stage whose shards are deduplicated.")
    priority: list[str] = Field(
        default_factory=list,
        description="Datasets, highest quality first: a group of duplicates keeps its member from the first "
                    "listed dataset (then the first in the input's order: shards by name, rows in order). Datasets not "
                    "listed rank after all listed ones, and the raw crawl (common-crawl) after those: a curated copy "
                    "(OpenWebText2, Books3, Pile-CC) is kept over the crawl's.")
    exact: bool = Field(True, description="Remove exact duplicates of the normalised text before the fuzzy pass.")
    shingle: Literal["word", "char"] = Field("word", description="Shingles: word n-grams or character n-grams.")
    ngram: int = Field(5, ge=1, le=64, description="Shingle length in words (or characters).")
    num_perm: int = Field(128, ge=2, le=1024, description="MinHash permutations.")
    seed: int = Field(1, ge=0, le=2**32 - 1, description="Seed of the MinHash permutations (datasketch's).")
    threshold: float = Field(0.8, gt=0.0, lt=1.0, description="Jaccard similarity that makes two documents duplicates.")
    # datasketch's derivation for 0.8 (equal false-positive and false-negative weights) gives 9 x 13, which
    # misses 7% of the pairs at Jaccard 0.9 and 60% at 0.8; with verification a false candidate costs only
    # a check, so the default favours recall: 20 x 6 misses 3e-7 at 0.9 and 0.2% at 0.8.
    bands: int = Field(20, ge=0, description="LSH bands; 0 with rows 0: derived from threshold as datasketch does.")
    rows: int = Field(6, ge=0, description="Signature values per band (bands x rows <= num_perm).")
    verify: bool = Field(True, description="Check each LSH candidate's exact Jaccard of shingle sets (drops false positives).")
    max_centers: int = Field(256, ge=1, le=100_000,
                             description="Each bucket member is compared with the bucket's first this-many members "
                                         "(all pairs in smaller buckets; a 100,000-member bucket stays linear).")
    band_shards: int = Field(0, ge=0, description="Shards of the bucket pass (bands split among them); 0: one per band.")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="Where signatures are computed: gpu (a CuPy kernel, bit-identical), cpu, or auto (gpu when present).")
    batch_docs: int = Field(1000, ge=1, le=100_000, description="Documents per batch.")
    recheck_docs: int = Field(2000, ge=0, description="Kept documents the suite re-checks against their bucket mates.")

    @model_validator(mode="after")
    def _bands_rows(self):
        if (self.bands == 0) != (self.rows == 0):
            raise ValueError("set both bands and rows, or neither (derived from threshold)")
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows = {self.bands * self.rows} exceeds num_perm {self.num_perm}")
        dup = sorted({d for d in self.priority if self.priority.count(d) > 1})
        if dup:
            raise ValueError(f"priority names a dataset twice: {', '.join(dup)}")
        return self

    def lsh(self) -> tuple[int, int]:
        from tasks.dedup.lsh import optimal_bands

        return (self.bands, self.rows) if self.bands else optimal_bands(self.threshold, self.num_perm)
