"""The errors a user can act on, and how any error becomes one line and an exit code.

Every message names the file, key or stage and the cause. `python -m tasks`, `python -m
flows.pipeline` and the Prefect flows all go through `describe`, so a failure reads the same on
the console, in `dvc repro` and as a Prefect run's state message:

    0 ok · 2 bad configuration or input files · 3 failed expectation · 4 unfinished input stage
    1 anything else (an I/O error names the path and the errno)
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


class PipelineError(Exception):
    """Base of the errors with a known exit code and label."""

    exit_code = 1
    label = "error"


class ConfigError(PipelineError, ValueError):
    """A bad configuration: one clear message naming the offending key(s) and what was expected."""

    exit_code = 2
    label = "configuration error"


class InputFileError(PipelineError, ValueError):
    """An input file the user supplied (an evaluation-task file, a curated dataset) is unusable."""

    exit_code = 2
    label = "input file error"


class ExpectationFailed(PipelineError, RuntimeError):
    """A stage's output violated its expectation suite; names expectation, column, count, shard."""

    exit_code = 3
    label = "validation failed"

    def __init__(self, stage: str, failures: list[str], docs: str):
        self.stage, self.failures, self.docs = stage, failures, docs
        self.report = None  # the full ValidationReport, attached by tasks.validation
        super().__init__(f"stage '{stage}' failed validation: " + "; ".join(failures) + f" (Data Docs: {docs})")


class TrainingError(PipelineError, RuntimeError):
    """Training cannot go on (a non-finite loss outside loss scaling): names the step and the cause."""

    label = "training failed"


class UnfinishedInput(PipelineError, RuntimeError):
    """A stage was asked to run on an input stage that has not completed."""

    exit_code = 4
    label = "unfinished input"


class StageBusy(PipelineError, RuntimeError):
    """Another run holds the stage (running it, or reading it as its input) in the same data folder."""

    label = "stage busy"


class StageFailed(PipelineError, RuntimeError):
    """More of a stage's shards failed than its bound allows (each failure is named)."""

    label = "stage failed"


class CodeChanged(PipelineError, RuntimeError):
    """A stage's code changed on disk while the stage ran: its outputs are the old code's, and `dvc
    repro` would record them against the new code (it hashes the deps after the command)."""

    label = "code changed"


class DiskFull(PipelineError, OSError):
    """A write failed for want of space where the path was not named (Great Expectations writing Data
    Docs) or with no errno at all (numpy's `np.save` reports a short fwrite as `N requested and M
    written`): the line names the run's data folder and the space left, so the user knows what to free."""

    label = "I/O error"


def _io_line(e: OSError) -> str:
    code = errno.errorcode.get(e.errno or 0, "")
    what = e.strerror or str(e)
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    return f"I/O error: {what}" + (f" ({code})" if code else "") + (f": {' -> '.join(paths)}" if paths else "")


_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _free_space(folder: Path) -> str:
    """'<free> free there' for the folder's file system, then for each other file system mounted in it
    (a stage's folder, the Data Docs) or holding the temporary folder: the full one is among them."""
    try:
        return _free_space_of(Path(folder))
    except Exception:  # the report must never hide the error it reports
        return "its free space unknown"


def _free_space_of(folder: Path) -> str:
    def device(path: Path) -> tuple[int, int] | None:
        try:
            return os.stat(path).st_dev, shutil.disk_usage(path).free
        except OSError:
            return None
    # not tempfile.gettempdir(): on first use it writes a probe file, which on a full disk fails
    temporary = Path(tempfile.tempdir or os.environ.get("TMPDIR") or "/tmp")
    top = folder
    while not top.exists() and top != top.parent:
        top = top.parent
    try:
        subfolders = sorted(f for f in top.iterdir() if f.is_dir())
    except OSError:
        subfolders = []
    seen: dict[int, str] = {}
    for path in [top, *subfolders, temporary]:
        if (found := device(path)) and found[0] not in seen:
            seen[found[0]] = f"{_size(found[1])} " + ("free there" if not seen else f"in {path}")
    return ", ".join(seen.values()) or "its free space unknown"


@contextmanager
def naming_full_disk(folder: Path):
    """In a stage's run: a full disk whose error names no path, or a short write with no errno, becomes
    one line naming `folder` (the run's data folder) and the space left."""
    try:
        yield
    except OSError as e:
        if isinstance(e, PipelineError) or e.filename is not None:
            raise
        if e.errno in _FULL:
            raise DiskFull(f"{e.strerror} ({errno.errorcode[e.errno]}) writing under {folder} "
                           f"({_free_space(folder)})") from e
        if e.errno is None and (short := _SHORT_WRITE.fullmatch(str(e))):
            raise DiskFull(f"a write under {folder} was cut short ({short[2]} of {short[1]} items written; "
                           f"{_free_space(folder)}): is the disk full?") from e
        raise


def describe(e: BaseException) -> tuple[int, str]:
    """(exit code, one line) for any exception."""
    if isinstance(e, PipelineError):
        return e.exit_code, f"{e.label}: {_first_line(str(e))}"
    if isinstance(e, OSError) and e.errno is not None:
        return 1, _io_line(e)
    return 1, f"error: {type(e).__name__}: {_first_line(str(e)) or 'no message'}"


def from_line(line: str, suffix: str = "") -> PipelineError:
    """The error a one-line message made by `describe` in another process stands for (a rank of a
    training run), so the stage fails with the same label and exit code; unknown lines: TrainingError."""
    todo, classes = [PipelineError], []
    while todo:
        classes.append(cls := todo.pop())
        todo += cls.__subclasses__()
    for cls in classes:
        # only errors built from their message alone (not ExpectationFailed, which carries a report),
        # and not DiskFull: its label is every I/O error's ("I/O error: Permission denied ...")
        if (cls is not PipelineError and "__init__" not in cls.__dict__ and not issubclass(cls, OSError)
                and line.startswith(cls.label + ": ")):
            return cls(line[len(cls.label) + 2:] + suffix)
    return TrainingError(line + suffix)


def naming_params(line: str, params_file: str) -> str:
    """`line` with its hints to run a stage (`python -m tasks <stage>`) naming the params file of this run,
    when it is not the default: the hint alone ran on params.yaml's data folder."""
    if params_file == "params.yaml":
        return line
    return re.sub(r"`python -m tasks (\S+)`", rf"`python -m tasks \1 --params {params_file}`", line)


def exit_code_of(line: str) -> int:
    """The exit code a line made by `describe` stands for (Prefect states carry only the line)."""
    for cls in (ConfigError, InputFileError, ExpectationFailed, UnfinishedInput):
        if line.startswith(cls.label + ":"):
            return cls.exit_code
    return 1


def _first_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[0] if len(lines) == 1 else " / ".join(lines[:3])
