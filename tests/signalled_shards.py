"""Shards that run until a stop reaches them, and a signal sent to one shard's thread once they have
all started: the drill of both shard mappers' interrupt tests (the command's, tests/test_shard_threads.py,
and the flows', tests/test_prefect_stop.py, which runs it in a child process). The kernel may deliver
Ctrl-C's signal to any thread; its Python handler then runs in the main thread once that wakes, so a
mapper waiting on its shards in one untimed wait saw it only when a shard ended."""
from __future__ import annotations

import signal
import threading
import time

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

    def signal_a_shard(self, sig: int) -> threading.Thread:
        """Once every shard has started, `sig` to the first one's thread (pthread_kill), not the main one."""
        sender = threading.Thread(target=lambda: (self.started.wait(), signal.pthread_kill(self.threads[0], sig)),
                                  daemon=True)
        sender.start()
        return sender


def interrupt(*_) -> None:
    """A handler for the drill's signal: KeyboardInterrupt, as tasks.core.interrupts' handlers raise it
    in the main thread."""
    raise KeyboardInterrupt
