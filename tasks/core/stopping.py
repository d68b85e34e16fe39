"""A stop asked of the shards running in worker threads, which never get the KeyboardInterrupt themselves.

The shard threads (tasks/core/shard_threads.py) ask it when the run is interrupted or cancelled. Shard code
checks it where it loops (a document written or read, a page extracted, a chunk downloaded), so it
stops at a known point rather than wherever an asynchronous exception would land (inside an import
lock, say). The flag travels in a context variable, which Prefect copies into each task's thread;
elsewhere (shards run in the main thread, `runner.kind: sequential`, or a worker process) there is none
and `check()` costs one lookup. A shard blocked where no check is reached (a read from a stalled server)
registers how to unblock it (`on_stop`): the stop calls it at once, instead of the wait lasting until the
read's timeout (download.timeout_s, 60 s by default).
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from typing import Callable, Iterator


class StopRequest(threading.Event):
    """The flag a stop sets, and what the shards blocked meanwhile asked to be called then."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks_lock = threading.Lock()
        self._hooks: set[Callable[[], None]] = set()

    def set(self) -> None:
        super().set()
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:  # each shard's own: one that fails leaves the others' to run
            with contextlib.suppress(Exception):
                hook()

    @contextlib.contextmanager
    def hooked(self, hook: Callable[[], None]) -> Iterator[None]:
        with self._hooks_lock:
            self._hooks.add(hook)
        try:
            if self.is_set():  # asked before it was registered
                with contextlib.suppress(Exception):
                    hook()
            yield
        finally:
            with self._hooks_lock:
                self._hooks.discard(hook)


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


def on_stop(hook: Callable[[], None]):
    """Around a blocking call that no check interrupts: `hook` (which unblocks it, e.g. shuts its socket down)
    is called when the run is stopped meanwhile, from the stopping thread. Nothing outside a stoppable run."""
    requested = _REQUESTED.get()
    if isinstance(requested, StopRequest):
        return requested.hooked(hook)
    return contextlib.nullcontext()
