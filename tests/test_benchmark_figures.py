"""The benchmarks' figures measure what they name: found by an independent review of benchmarks/."""
from __future__ import annotations

import argparse
import math

import pytest

from tests.conftest import REPO


def test_a_nan_loss_is_the_largest_difference_not_a_skipped_one():
    """max() keeps a NaN only when it comes first: an engine whose losses went NaN after step 1 gave
    parity_max_rel_diff=0, and a resumed run that diverged resume_max_abs_diff=0."""
    from trainer.parity import max_rel_diff, worst
    assert max_rel_diff([2.0, math.nan, 2.0], [2.0, 2.0, 2.0]) == math.inf
    assert worst([0.0, math.nan]) == math.inf and worst([0.5, 0.25]) == 0.5
    assert max_rel_diff([1.0, 2.2], [1.0, 2.0]) == pytest.approx(0.1)


def test_filter_agreement_applies_our_rules_to_its_texts():
    """Its texts were labelled a dataset outside filter.rules_datasets: our side dropped nothing, and the
    figure was datatrove's keep rate (0.212 printed for 0.994)."""
    from benchmarks.filter_agreement import ours
    from tasks.core.config import load_params
    p = load_params(REPO / "params.yaml")
    prose = ("The committee met on Tuesday to review the budget. Members agreed that the plan was sound. "
             "They asked the treasurer to prepare a final report before the next meeting. The report will list "
             "every cost of the new library. It will be shared with the town in the spring. Everyone thanked the "
             "chair for her work.")
    kept, _ = ours([prose, "click here"], "c4", p)
    assert kept == [True, False]


def test_benchmark_sizes_are_refused_in_one_line_below_what_makes_a_figure():
    from benchmarks import at_least
    parse = at_least(9)
    assert parse("900") == 900
    for bad in ("0", "8", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
