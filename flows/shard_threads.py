"""Stop a stage's shards promptly when the run is interrupted (Ctrl-C, or the SIGINT a Prefect worker
sends a flow run it stops).

The threads and sequential task runners run shards in worker threads, and only the main thread gets
the KeyboardInterrupt. A thread cannot be killed, and both the task runner's exit and the
interpreter's wait for every running thread, so an interrupted run went on until each shard in
progress had finished: seconds on the sample, many minutes for a real WARC file. Here each running
shard's thread gets the KeyboardInterrupt too (CPython's PyThreadState_SetAsyncExc, as Prefect's own
thread cancel scopes do), at its next Python instruction. A shard stopped midway leaves only a
temporary file (its output and marker are written atomically, as after kill -9); the rerun redoes it.

The processes and dask runners' workers get the terminal's SIGINT themselves.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import threading

_RUNNING: contextvars.ContextVar["ShardThreads | None"] = contextvars.ContextVar("shard_threads", default=None)


class ShardThreads:
    """The threads running one stage pass's shards right now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idents: set[int] = set()

    @contextlib.contextmanager
    def mapping(self):
        """While the main thread maps shards: tasks submitted in here (Prefect copies the context into
        each task's thread) register their thread; an interrupt of the main thread reaches them."""
        token = _RUNNING.set(self)
        try:
            yield
        except BaseException as e:
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit, Prefect's TerminationSignal
                self.interrupt()
            raise
        finally:
            _RUNNING.reset(token)

    def interrupt(self) -> int:
        """Raise KeyboardInterrupt in every thread running a shard; the number of threads reached."""
        with self._lock:
            return sum(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                                 ctypes.py_object(KeyboardInterrupt))
                       for ident in self._idents)


@contextlib.contextmanager
def running_shard():
    """Around one shard's work in whatever thread runs it (nothing outside a `mapping`, or in another
    process)."""
    threads = _RUNNING.get()
    if threads is None:
        yield
        return
    ident = threading.get_ident()
    with threads._lock:
        threads._idents.add(ident)
    try:
        yield
    finally:
        with threads._lock:
            threads._idents.discard(ident)
