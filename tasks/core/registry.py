"""The DAG: every stage in order, one line each. `python -m tasks`, dvc.yaml, the Prefect flows and
the validation runner all walk this tuple; a new stage is one more line here."""
from __future__ import annotations

from tasks.core.stage import Stage
from tasks.decontaminate.stage import STAGE as decontaminate
from tasks.dedup.stage import STAGE as dedup
from tasks.download.stage import STAGE as download
from tasks.evaluate.stage import STAGE as evaluate
from tasks.extract.stage import STAGE as extract
from tasks.filter.stage import STAGE as filter_
from tasks.sample.stage import STAGE as sample
from tasks.tokenize.stage import STAGE as tokenize
from tasks.train.stage import STAGE as train

STAGES: tuple[Stage, ...] = (sample, download, extract, filter_, dedup, decontaminate, tokenize, train, evaluate)
PIPELINE: tuple[str, ...] = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}


def stage(name: str) -> Stage:
    if name not in _BY_NAME:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(PIPELINE)}")
    return _BY_NAME[name]
