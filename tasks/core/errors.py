"""The errors a user can act on. Each carries one line naming the file, key or stage and the cause;
`python -m tasks` maps them to exit codes (README: 2 configuration/input files, 4 unfinished input)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration: one clear message naming the offending key(s) and what was expected."""


class UnfinishedInput(RuntimeError):
    """A stage was asked to run on an input stage that has not completed."""
