"""Run a function on many items in a child process, with a time limit per item.

Extraction libraries (C++ or pure Python) can spin on a pathological page; neither a thread nor
SIGALRM can stop native code, so extraction runs in a child process (`python -m tasks.extract.sandbox_child`)
that the parent kills and restarts when one item overruns. The child is a plain interpreter, not
multiprocessing, so it never re-imports the caller's __main__ (stdin, notebooks, Prefect workers).
Items are pipelined (up to MAX_ITEMS / WINDOW_BYTES in flight) so the parent reads ahead while
the child works; the parent never blocks on a write (non-blocking stdin, polling both pipes),
so it can never wait on a child that is itself blocked writing a result.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Iterator

from tasks.core import stopping
from tasks.extract.sandbox_child import READY, frame, read_frame, write_frame

TIMED_OUT = "timed out"
WINDOW_BYTES = 4 << 20
MAX_ITEMS = 16  # measured: 16 in flight keeps the child fed (4 left it waiting ~0.1 ms per page)
PIPE_BYTES = 1 << 20
START_TIMEOUT_S = 120.0
# The parent polls the child's pipe with short naps rather than sleeping in select(): a parent
# blocked in select() makes the child's every result write wake it, and on a VM that cross-CPU
# wake-up is charged to the child, the critical path (measured: ~7% of the child's time in the
# kernel's wake-up path). A nap adds at most POLL_MAX_S to an item's observed time.
POLL_MIN_S, POLL_MAX_S = 0.0005, 0.004


def _child_env() -> dict[str, str]:
    """A fresh glibc process returns freed heap to the kernel after every page-sized parse, and
    the HTML parser then page-faults its arenas back in for the next document (measured: 140k
    minor faults and +60% CPU for 3k pages). Keeping freed memory (up to 128 MiB) removes that."""
    env = dict(os.environ)
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(128 << 20))
    env.setdefault("MALLOC_TOP_PAD_", str(64 << 20))
    env["PYTHONPATH"] = os.pathsep.join(_import_path())
    return env


def _import_path() -> list[str]:
    """The parent's module search path, for a child started without `site` (-S): `site` spends
    ~20 ms of a ~50 ms start on .pth files (an editable install's finder alone ~17 ms). The
    child then finds exactly the modules the parent would, plus the project's own packages."""
    # the folder that holds tasks/ (a checkout or site-packages): from another working directory the child,
    # without `site`, found no `tasks` in an editable install and every page of every shard failed
    root = str(Path(__file__).resolve().parents[2])
    seen = [root]
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if entry not in seen and os.path.exists(entry):  # folders, and zip or egg archives
            seen.append(entry)
    return seen


def _widen_pipe(fd: int) -> None:
    """Linux pipes hold 64 KiB; a page is ~25 KiB, so every item would cost several wake-ups of
    each side. 1 MiB (the unprivileged maximum) lets a whole item cross in one write/read."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass  # not Linux, or the limit is lower here: a smaller pipe is only slower


_IN_EVENTS = select.POLLIN | select.POLLHUP | select.POLLERR  # EOF (the child died) reads as readable
_OUT_EVENTS = select.POLLOUT | select.POLLHUP | select.POLLERR  # a closed reader: _send sees BrokenPipeError


def _ready(out_fd: int, in_fd: int | None) -> tuple[bool, bool]:
    """(the child's stdout can be read, its stdin can be written), without waiting. poll(), not
    select(): select() refuses any descriptor past 1023, and a process running many shards in
    threads, each with a child and its pipes, gets there (each shard then failed on its first page)."""
    poller = select.poll()
    poller.register(out_fd, select.POLLIN)
    if in_fd is not None:
        poller.register(in_fd, select.POLLOUT)
    events = dict(poller.poll(0))
    return bool(events.get(out_fd, 0) & _IN_EVENTS), in_fd is not None and bool(events.get(in_fd, 0) & _OUT_EVENTS)


class TimeLimitedWorker:
    """`target` is "module:function"; the function takes one item of plain data (see sandbox_child)."""

    def __init__(self, target: str):
        self.target = target
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.ready, self.started = False, 0.0

    def _start(self) -> None:
        """Launch without waiting: items queue in the pipe while the child imports; its first
        frame (READY) is consumed in map(), and no item's clock runs before it."""
        # its stderr to a file: a child that cannot start says why in the error (each restart printed its
        # traceback, once per page); library noise and native crash reports stay off the console
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-S", "-m", "tasks.extract.sandbox_child", self.target],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, bufsize=0,
                                     env=_child_env())
        os.set_blocking(self.proc.stdin.fileno(), False)
        for f in (self.proc.stdin, self.proc.stdout):
            _widen_pipe(f.fileno())
        self.ready, self.started = False, time.monotonic()

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.stderr.close()
        self.proc = None

    def _failed_to_start(self) -> RuntimeError:
        """The child died before it was up: every page would fail alike, so the shard fails, naming why."""
        try:
            self.proc.wait(timeout=5)  # its stdout ended: it is exiting, unless it closed stdout and lives on
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        code = self.proc.returncode
        self.stderr.seek(0)
        lines = [x.strip() for x in self.stderr.read()[-4096:].decode("utf-8", "replace").splitlines() if x.strip()]
        self._kill()
        return RuntimeError(f"the extraction process ({self.target}) exited with code {code} before it was up"
                            + (f": {lines[-1]}" if lines else ""))

    def map(self, items: Iterable[Any], time_limit: float) -> Iterator[tuple[bool, Any]]:
        """Yield (ok, result) per item, in order; (False, TIMED_OUT) for an item over the limit.

        An item's clock starts when the child answered the item before it (the child works in
        order), so queued items never count against each other, and stops while the caller holds a
        result (its own work between two items is not the child's).
        """
        pending: deque = deque()  # (item, frame size)
        try:
            yield from self._map(iter(items), time_limit, pending)
        finally:
            if pending:  # left early (the caller failed or was interrupted): the child still owes answers
                self._kill()  # that the next call would take for its own

    def _map(self, it: Iterator[Any], time_limit: float, pending: deque) -> Iterator[tuple[bool, Any]]:
        exhausted = False
        unsent, pending_bytes, last = bytearray(), 0, time.monotonic()  # a reused child is idle now
        nap = POLL_MIN_S
        if self.proc is not None and self.proc.poll() is not None:
            self._kill()  # a reused child that died while idle owes nothing: start afresh, blaming no item
        while True:
            stopping.check()  # the run was interrupted: this page's shard stops here
            # A child that died mid-shard is found by reading its pipe to the end, not by its exit status:
            # its last answers (and READY) may still be in the pipe. Restarting on the status dropped them,
            # resent answered items, and counted a crash on the first pages as a failure to start.
            if self.proc is None:
                self._start()  # resend what the dead child never answered
                unsent = bytearray(b"".join(frame(x) for x, _ in pending))
                last = time.monotonic()
            while not exhausted and len(pending) < MAX_ITEMS and (not pending or pending_bytes < WINDOW_BYTES):
                try:
                    item = next(it)
                except StopIteration:
                    exhausted = True
                    break
                data = frame(item)
                unsent += data
                pending.append((item, len(data)))
                pending_bytes += len(data)
                self._send(unsent)  # at once: the child may be idle (a new shard starts here)
            if not pending:
                return
            if not self.ready:
                wait = self.started + START_TIMEOUT_S - time.monotonic()
                if wait <= 0:
                    self._kill()
                    raise RuntimeError(f"sandbox child for {self.target} did not start")
            else:
                wait = last + time_limit - time.monotonic()
            if wait <= 0:
                pending_bytes -= pending.popleft()[1]
                self.restarts += 1
                self._kill()
                yield False, TIMED_OUT
                continue
            out_fd = self.proc.stdout.fileno()
            # its status before its pipe: what a dead child wrote is in the pipe by the time it is dead
            dead = self.proc.poll() is not None
            readable, writable = _ready(out_fd, self.proc.stdin.fileno() if unsent else None)
            if not readable and not writable and not dead:  # nap instead of blocking: see POLL_MIN_S
                time.sleep(min(nap, wait))
                nap = min(2 * nap, POLL_MAX_S)
                continue
            nap = POLL_MIN_S
            if writable:
                self._send(unsent)
            if readable or dead:
                try:
                    if not readable:  # dead, its pipe empty, yet no EOF: a process it forked holds the pipe
                        raise EOFError
                    result = read_frame(out_fd)
                except EOFError:  # the child died (e.g. a crash in native code)
                    if not self.ready:
                        raise self._failed_to_start() from None
                    pending_bytes -= pending.popleft()[1]
                    self._kill()
                    yield False, "worker crashed"
                    continue
                last = time.monotonic()
                if not self.ready:  # the child's first frame says it is up; nothing to pop
                    self.ready = result == READY
                    continue
                pending_bytes -= pending.popleft()[1]
                suspended = time.monotonic()
                yield result
                # the caller's time between two answers is not the child's (the first language ID of a
                # process loads its model and compiled code: ~0.5 s, ~4 s cold, more on a loaded machine)
                last += time.monotonic() - suspended

    def _send(self, unsent: bytearray) -> None:
        """Write what the pipe takes now, never blocking."""
        try:
            del unsent[:os.write(self.proc.stdin.fileno(), unsent)]
        except BlockingIOError:
            pass
        except BrokenPipeError:  # the child died; map() answers or restarts it
            unsent.clear()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                write_frame(self.proc.stdin.fileno(), None)
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


def close_workers() -> None:
    """Stop this thread's workers (the next map() starts fresh children)."""
    for w in getattr(_local, "workers", {}).values():
        w.close()
    getattr(_local, "workers", {}).clear()
