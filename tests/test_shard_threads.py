"""An interrupt of the main thread reaches the threads running a stage's shards (flows/shard_threads.py),
with a thread pool that copies the context into each task as Prefect's ThreadPoolTaskRunner does."""
from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from flows.shard_threads import ShardThreads, running_shard


def work(started: threading.Event, release: threading.Event, as_shard: bool) -> str:
    """Python-level work, as a shard's loop over documents is, until released (or 60 s pass)."""
    def loop() -> str:
        started.set()
        deadline = time.monotonic() + 60
        while not release.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "finished"
    if not as_shard:
        return loop()
    with running_shard():
        return loop()


def run(stop_with: BaseException) -> list:
    release = threading.Event()
    started = [threading.Event() for _ in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            with pytest.raises(type(stop_with)):
                with ShardThreads().mapping():
                    futures = [pool.submit(contextvars.copy_context().run, work, started[i], release, i < 2)
                               for i in range(3)]
                    for s in started:
                        assert s.wait(60)
                    raise stop_with
        finally:
            release.set()
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result())
            except BaseException as e:
                outcomes.append(type(e))
    return outcomes


def test_an_interrupt_reaches_the_shards_and_only_them():
    assert run(KeyboardInterrupt()) == [KeyboardInterrupt, KeyboardInterrupt, "finished"]


def test_a_failure_of_the_main_thread_lets_the_shards_finish():
    """A failed shard fails the stage; the others in progress finish and stay done for the rerun."""
    assert run(ValueError("a shard failed")) == ["finished", "finished", "finished"]

