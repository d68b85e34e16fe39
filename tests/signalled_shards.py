"""Shards that run until a stop reaches them, and a signal sent to one shard's thread once they have
all started and the main thread waits on them: the drill of both shard mappers' interrupt tests (the
command's, tests/test_shard_threads.py, and the flows', tests/test_prefect_stop.py, which runs it in a
child process). The kernel may deliver Ctrl-C's signal to any thread; its Python handler then runs in
the main thread once that wakes, so a mapper waiting on its shards in one untimed wait saw it only when
a shard ended."""
from __future__ import annotations

import signal
import threading
import time
from typing import Callable

from tasks.core import stopping
from tasks.core.stopping import ShardsStopped


class SignalledShards:
    def __init__(self, shards: int = 2):
        self.started = threading.Barrier(shards + 1, timeout=120)
        self.waiting = threading.Event()  # the main thread has gone into the mapper's wait (`announcing`)
        self.ended = threading.Event()
        self.threads: list[int] = []
        self.outcomes: dict[str, str] = {}  # each shard's name: "stopped", or "finished" after 60 s
        self._sender: threading.Thread | None = None

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

    def announcing(self, wait: Callable) -> Callable:
        """The mapper's wait on its shards, saying first that the main thread is in it: a test puts this
        in its place. (Looking at the main thread's frames from the sender instead, walking f_back while
        that thread ran, crashed Python 3.11 now and then.)"""
        def announced(*args, **kwargs):
            self.waiting.set()
            return wait(*args, **kwargs)
        return announced

    def signal_a_shard(self, sig: int) -> None:
        """Once every shard has started and the main thread waits on them, `sig` to the first shard's
        thread (pthread_kill), not the main one. Sent as soon as the shards had started, it mostly came
        while the main thread was still starting the last shard's thread (Thread.start waits for it) and
        ran there: the test passed on a mapper whose wait on its shards was one untimed wait."""
        def send() -> None:
            try:
                self.started.wait()
            except threading.BrokenBarrierError:  # ended before the shards started
                return
            while not self.ended.is_set():  # a mapper that never announces its wait gets no signal
                if self.waiting.wait(0.05):
                    # announced just before the wait: a moment for the main thread to block in it (sent at
                    # once, under load it sometimes ran before that, and an untimed wait passed 3 runs in 80)
                    if not self.ended.wait(0.05):
                        signal.pthread_kill(self.threads[0], sig)
                    return

        self._sender = threading.Thread(target=send, daemon=True)
        self._sender.start()

    def end(self) -> None:
        """After the mapping, before the signal's handler is put back: a sender that has not sent stops
        (it would signal a thread that has gone, or, with the default handler back, end the process)."""
        self.ended.set()
        self.started.abort()
        if self._sender is not None:
            self._sender.join()


def interrupt(*_) -> None:
    """A handler for the drill's signal: KeyboardInterrupt, as tasks.core.interrupts' handlers raise it
    in the main thread."""
    raise KeyboardInterrupt
