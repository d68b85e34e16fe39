"""Run a function on many items in a child process, with a time limit per item.

Extraction libraries (C++ or pure Python) can spin on a pathological page; neither a thread nor
SIGALRM can stop native code, so extraction runs in a child process (`python -m tasks.sandbox`)
that the parent kills and restarts when one item overruns. The child is a plain interpreter, not
multiprocessing, so it never re-imports the caller's __main__ (stdin, notebooks, Prefect workers).
Items are pipelined, but only up to WINDOW_BYTES in flight: with both pipe buffers bounded, the
parent blocking on a write can never wait on a child blocked on its own write.
"""
from __future__ import annotations

import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from collections import deque
from typing import Any, Iterable, Iterator

TIMED_OUT = "timed out"
WINDOW_BYTES = 32 << 10
_HDR = struct.Struct("<Q")


def _write_frame(fd: int, obj: Any) -> int:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = memoryview(_HDR.pack(len(data)) + data)
    while buf:
        buf = buf[os.write(fd, buf):]
    return len(data)


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _read_frame(fd: int) -> Any:
    (n,) = _HDR.unpack(_read_exact(fd, _HDR.size))
    return pickle.loads(_read_exact(fd, n))


def _resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class TimeLimitedWorker:
    """`target` is "module:function"; the function takes one picklable item."""

    def __init__(self, target: str):
        self.target = target
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tasks.sandbox", self.target],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
        self.proc = None

    def _send(self, item: Any) -> int:
        return _write_frame(self.proc.stdin.fileno(), item)

    def map(self, items: Iterable[Any], time_limit: float) -> Iterator[tuple[bool, Any]]:
        """Yield (ok, result) per item, in order; (False, TIMED_OUT) for an item over the limit."""
        it, pending, exhausted, in_flight = iter(items), deque(), False, 0
        while True:
            if self.proc is None or self.proc.poll() is not None:
                self._kill()
                self._start()
                in_flight = sum(self._send(x) for x, _ in pending)  # what the dead child never answered
            while not exhausted and (not pending or in_flight < WINDOW_BYTES):
                try:
                    item = next(it)
                except StopIteration:
                    exhausted = True
                    break
                size = self._send(item)
                pending.append((item, size))
                in_flight += size
            if not pending:
                return
            fd = self.proc.stdout.fileno()
            ready, _, _ = select.select([fd], [], [], time_limit)
            _, size = pending.popleft()
            in_flight -= size
            if not ready:
                self.restarts += 1
                self._kill()
                yield False, TIMED_OUT
                continue
            try:
                yield _read_frame(fd)
            except EOFError:  # the child died (e.g. a crash in native code)
                self._kill()
                yield False, "worker crashed"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                _write_frame(self.proc.stdin.fileno(), None)
                self.proc.wait(timeout=5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


_local = threading.local()


def worker_for(target: str) -> TimeLimitedWorker:
    """One long-lived worker per thread and target (starting one costs ~0.2 s, so reuse it)."""
    workers = getattr(_local, "workers", None)
    if workers is None:
        workers = _local.workers = {}
    if target not in workers:
        workers[target] = TimeLimitedWorker(target)
    return workers[target]


def _child_main(target: str) -> None:
    fn = _resolve(target)
    rfd, wfd = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the frame stream
    while True:
        try:
            item = _read_frame(rfd)
        except EOFError:
            return
        if item is None:
            return
        try:
            out = (True, fn(item))
        except Exception as e:  # reported per item, never fatal to the shard
            out = (False, f"{e.__class__.__name__}: {e}")
        _write_frame(wfd, out)


if __name__ == "__main__":
    _child_main(sys.argv[1])
