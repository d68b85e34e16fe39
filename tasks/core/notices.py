"""Notices a stage's core gives as it runs, one line each (the train stage's run moved aside, deleted, resumed):
on stderr for a command; in the flow run's log for a Prefect run, which forwards them (`forwarded_to`). Printed
to stderr, they reached the worker's terminal only, and the UI never said that a run had been moved or deleted.
(Not a logging.Logger: a handler that pytest, or anything else, attaches to it would take the lines from stderr.)"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

_LISTENERS: list[Callable[[str], None]] = []  # this process's stage run's, while one forwards them


def notice(line: str) -> None:
    if _LISTENERS:
        _LISTENERS[-1](line)
    else:
        print(line, file=sys.stderr)


@contextlib.contextmanager
def forwarded_to(say: Callable[[str], None]) -> Iterator[None]:
    """The notices given in the block go to `say` (a Prefect run logger's warning) instead of stderr."""
    _LISTENERS.append(say)
    try:
        yield
    finally:
        _LISTENERS.remove(say)
