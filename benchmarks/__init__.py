"""Benchmarks: each prints its figures, its last line `name=value ...`."""
from __future__ import annotations

import argparse


def at_least(low: float, kind=int):
    """An argparse type: a number of `kind` no smaller than `low` (0 documents or 0 MB printed a traceback)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low} (got {text})")
        return value
    return parse
