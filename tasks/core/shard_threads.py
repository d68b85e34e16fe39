"""Stop a stage's shards promptly when the run is interrupted (Ctrl-C, or Prefect's cancellation of a
deployment's run).

The threads and sequential task runners run shards in worker threads, and only the main thread gets
the KeyboardInterrupt. A thread cannot be killed, and both the task runner's exit and the
interpreter's wait for every running thread, so an interrupted run went on until each shard in
progress had finished: seconds on the sample, many minutes for a real WARC file. Now:

1. the shards are asked to stop (tasks.core.stopping); shard code checks at each document, page or
   downloaded chunk, and one about to start does not;
2. a shard still running after `grace_s` (it loops somewhere without a check), or at once on a second
   Ctrl-C, gets ShardsStopped raised in its thread (CPython's PyThreadState_SetAsyncExc, as Prefect's
   own thread cancel scopes do). That lands at its next Python instruction, wherever it is, which is
   why it is the fallback, and why it waits while the thread is inside an import (a third Ctrl-C gives
   that up).

A shard stopped midway leaves only a temporary file (its output and marker are written atomically, as
after kill -9); the rerun redoes it. The processes and dask runners' workers get the terminal's SIGINT
themselves.

`map_in_threads` is how `python -m tasks` (and so `dvc repro`) runs a pass's shards: in
`runner.max_workers` threads, as the Prefect flows' threads runner does (it ran them one after another).
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

from tasks.core.interrupts import importing
from tasks.core.stopping import ShardsStopped, StopRequest, stoppable

_RUNNING: contextvars.ContextVar["ShardThreads | None"] = contextvars.ContextVar("shard_threads", default=None)


class ShardThreads:
    """The threads running one stage pass's shards right now."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.grace_s = grace_s
        self.requested = StopRequest()
        self._lock = threading.Lock()
        self._idents: set[int] = set()

    @contextlib.contextmanager
    def mapping(self):
        """While the main thread maps shards: tasks submitted in here (Prefect copies the context into
        each task's thread) register their thread; an interrupt of the main thread stops them."""
        token = _RUNNING.set(self)
        try:
            with stoppable(self.requested):
                yield
        except BaseException as e:
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit, Prefect's cancellation
                self.stop()
            raise
        finally:
            _RUNNING.reset(token)

    def stop(self) -> None:
        self.requested.set()  # first: whatever happens below, the checks see it
        try:
            deadline = time.monotonic() + self.grace_s
            while self._running() and time.monotonic() < deadline:
                time.sleep(0.02)
        except BaseException:  # a second Ctrl-C or signal (the first is being raised): no more grace
            pass
        try:
            self._interrupt_the_rest()
        except BaseException:  # one more, while a shard inside an import is waited for: leave it be
            pass

    def _interrupt_the_rest(self) -> None:
        """Raise ShardsStopped in each shard still running, but never while it is inside an import: there
        the exception can land between importlib's taking a module lock and its `try`, the lock stays
        held, and every later import of that module (at exit too) waits forever. Such a thread is
        polled until it leaves the import (at which point it may well reach a check by itself)."""
        interrupted: set[int] = set()
        while True:
            with self._lock:  # held, so that a thread is interrupted only while it is still in its shard
                waiting = self._idents - interrupted
                if not waiting:
                    return
                frames = sys._current_frames()
                for ident in waiting:
                    if ident in frames and importing(frames[ident]):
                        continue
                    # between that look and this call the thread runs only if the GIL changes hands,
                    # which it does not on its own within the switch interval (5 ms)
                    self._interrupt(ident)
                    interrupted.add(ident)
            time.sleep(0.02)

    @staticmethod
    def _interrupt(ident: int) -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(ShardsStopped))

    def _running(self) -> bool:
        with self._lock:
            return bool(self._idents)


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
        if threads.requested.is_set():  # started after the stop was asked (Prefect checked its own flag before)
            raise ShardsStopped("the run was interrupted")
        threads._idents.add(ident)
    try:
        yield
    finally:
        with threads._lock:
            threads._idents.discard(ident)


WAKE_S = 0.2  # how often the main thread, waiting on its shards, wakes to run a signal's handler


def map_in_threads(workers: int, work: Callable[..., dict] | None = None):
    """A MapShards (tasks.core.runner) running each shard's `work` (process_shard) in up to `workers`
    threads. The results come in shard order; after a failure the shards already running finish (their
    outputs count for the rerun), those still queued are cancelled (a thread freed at that moment may have
    taken one), and the first failure in shard order is raised. An interrupt of the main thread stops the
    running shards (ShardThreads)."""
    def mapper(stage: str, pass_name: str, p, shards: list, ctx) -> list[dict]:
        from tasks.core.runner import process_shard
        run = work or process_shard

        def shard(s) -> dict:
            with running_shard():
                return run(stage, pass_name, p, s, ctx)

        if workers <= 1 or len(shards) <= 1:
            return [run(stage, pass_name, p, s, ctx) for s in shards]
        with ThreadPoolExecutor(min(workers, len(shards)), thread_name_prefix=f"{stage}.{pass_name}") as pool:
            try:
                with ShardThreads().mapping():  # inside the pool: stopped before the pool waits for its threads
                    futures = [pool.submit(contextvars.copy_context().run, shard, s) for s in shards]
                    pending, failed = set(futures), False
                    while pending:
                        # in short waits: a signal delivered to a shard thread runs its Python handler in the
                        # main thread only once that wakes, and in one untimed wait for the shards a Ctrl-C
                        # went unseen until a shard ended (1 run in about 10 of the interrupt test hung)
                        done, pending = wait(pending, timeout=WAKE_S, return_when="FIRST_EXCEPTION")
                        if not failed and any(map(_failed, done)):
                            failed = True
                            for f in pending:
                                f.cancel()  # queued: not started
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            for f in futures:  # the first failure in shard order, as one after another would have met it
                if _failed(f):
                    raise f.exception()
            return [f.result() for f in futures]
    return mapper


def _failed(future) -> bool:
    """A shard's future that ran and raised (a cancelled one has no exception to ask for: it would raise)."""
    return not future.cancelled() and future.exception() is not None
