"""Shards that run until a stop reaches them, and a signal sent to one shard's thread once they have
all started and the main thread waits on them: the drill of both shard mappers' interrupt tests (the command's, tests/test_shard_threads.py,
and the flows', tests/test_prefect_stop.py, which runs it in a child process). The kernel may deliver
Ctrl-C's signal to any thread; its Python handler then runs in the main thread once that wakes, so a
mapper waiting on its shards in one untimed wait saw it only when a shard ended."""
from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType
from typing import Callable

from tasks.core import stopping
from tasks.core.stopping import ShardsStopped


class SignalledShards:
    def __init__(self, shards: int = 2):
        self.started = threading.Barrier(shards + 1, timeout=120)
        self.threads: list[int] = []
        self.outcomes: dict[str, str] = {}  # each shard's name: "stopped", or "finished" after 60 s

    def work(self, stage, pass_name, p, shard, ctx) -> dict:
        """A MapShards work function (process_shard's signature)."""
        name = getattr(shard, "name", shard)
        self.threads.append(threading.get_ident())
        self.started.wait()
        deadline = time.monotonic() + 60  # then the shard ends by itself: a wrong mapper fails, not hangs
        try:
            while time.monotonic() < deadline:
                stopping.sleep(0.01)
        except ShardsStopped:
            self.outcomes[name] = "stopped"
            raise
        self.outcomes[name] = "finished"
        return {}

    def signal_a_shard(self, sig: int, main_waits: Callable[[FrameType], bool] = None) -> threading.Thread:
        """Once every shard has started and the main thread waits on them (`main_waits` of its innermost
        Python frame; by default in_threading_wait), `sig` to the first shard's thread (pthread_kill), not
        the main one. Sent as soon as the shards had started, it mostly came while the main thread was still
        starting the last shard's thread (Thread.start waits for it), and ran there: the test passed on a
        mapper whose wait on its shards was one untimed wait."""
        main_waits = main_waits or in_threading_wait
        main = threading.main_thread().ident

        def send() -> None:
            self.started.wait()
            deadline = time.monotonic() + 120  # a guard: never seen waiting, no signal, and the shards finish
            while time.monotonic() < deadline:
                frame = sys._current_frames().get(main)
                if frame is not None and main_waits(frame):
                    signal.pthread_kill(self.threads[0], sig)
                    return
                time.sleep(0.005)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        return sender


def in_threading_wait(frame: FrameType) -> bool:
    """A thread blocked in a threading wait (Condition, Event: concurrent.futures' wait for its futures),
    not in the one of Thread.start."""
    stack = []
    while frame is not None:
        stack.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    return stack[0] == (threading.__file__, "wait") and (threading.__file__, "start") not in stack


def interrupt(*_) -> None:
    """A handler for the drill's signal: KeyboardInterrupt, as tasks.core.interrupts' handlers raise it
    in the main thread."""
    raise KeyboardInterrupt
