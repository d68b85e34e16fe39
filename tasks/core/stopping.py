"""A stop asked of the shards running in worker threads, which never get the KeyboardInterrupt themselves.

The shard threads (tasks/core/shard_threads.py) ask it when the run is interrupted or cancelled. Shard code
checks it where it loops (a document written or read, a page extracted, a chunk downloaded), so it
stops at a known point rather than wherever an asynchronous exception would land (inside an import
lock, say). The flag travels in a context variable, which Prefect copies into each task's thread;
elsewhere (`python -m tasks`, which runs shards in the main thread, or a worker process) there is none
and `check()` costs one lookup.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import time

_REQUESTED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("stop_shards", default=None)


class ShardsStopped(KeyboardInterrupt):
    """Raised in a shard's thread at a check after the run was interrupted (a KeyboardInterrupt, so that
    no `except Exception` takes it for a failure of the shard, and Prefect records an interrupt)."""


@contextlib.contextmanager
def stoppable(requested: threading.Event):
    """Shards started in this context (and the threads it is copied into) stop once `requested` is set."""
    token = _REQUESTED.set(requested)
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def check() -> None:
    requested = _REQUESTED.get()
    if requested is not None and requested.is_set():
        raise ShardsStopped("the run was interrupted")


def sleep(seconds: float) -> None:
    """time.sleep that a stop cuts short (a retry's back-off can be 30 s)."""
    requested = _REQUESTED.get()
    if requested is None:
        time.sleep(seconds)
    else:
        requested.wait(seconds)
        check()
