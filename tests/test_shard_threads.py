"""An interrupt of the main thread stops the threads running a stage's shards (flows/shard_threads.py,
tasks/core/stopping.py), with a thread pool that copies the context into each task as Prefect's
ThreadPoolTaskRunner does."""
from __future__ import annotations

import contextvars
import importlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from flows.shard_threads import ShardThreads, running_shard
from tasks.core import interrupts, stopping
from tasks.core.stopping import ShardsStopped


def work(started: threading.Event, release: threading.Event, as_shard: bool, checks: bool) -> str:
    """Python-level work until released (or 60 s pass): a shard's loop over documents, with or
    without the stop checks shard code makes."""
    def loop() -> str:
        started.set()
        deadline = time.monotonic() + 60
        while not release.is_set() and time.monotonic() < deadline:
            if checks:
                stopping.check()
            time.sleep(0.01)
        return "finished"
    if not as_shard:
        return loop()
    with running_shard():
        return loop()


def run(stop_with: BaseException, threads: ShardThreads, checks: bool) -> list:
    """Two shards and one task that is not a shard run; the main thread stops with `stop_with`."""
    release = threading.Event()
    started = [threading.Event() for _ in range(3)]
    elsewhere = contextvars.copy_context()  # another thread of the process (e.g. a progress watcher)
    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            with pytest.raises(type(stop_with)):
                with threads.mapping():
                    futures = [pool.submit(contextvars.copy_context().run, work, started[i], release, True, checks)
                               for i in range(2)]
                    futures.append(pool.submit(elsewhere.run, work, started[2], release, False, checks))
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


def test_an_interrupt_stops_the_shards_at_their_checks_and_only_them(monkeypatch):
    fired = []
    monkeypatch.setattr(ShardThreads, "_interrupt", staticmethod(fired.append))
    assert run(KeyboardInterrupt(), ShardThreads(grace_s=120), checks=True) == [ShardsStopped, ShardsStopped, "finished"]
    assert fired == []  # the checks stopped them, not the asynchronous exception


def test_a_shard_that_never_checks_is_interrupted_after_the_grace():
    assert run(KeyboardInterrupt(), ShardThreads(grace_s=0.2), checks=False) == [ShardsStopped, ShardsStopped, "finished"]


def test_a_shard_inside_an_import_is_not_interrupted_there(tmp_path, monkeypatch):
    """The exception could land between importlib's taking the module lock and its `try`: the lock
    stayed held and the threads waiting on it (and the next import of the module) hung for good."""
    name = f"slow_module_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.5)  # torch, cupy: seconds to import\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    threads, outcomes = ShardThreads(grace_s=0.1), {}

    def shard(i: int) -> None:
        try:
            with running_shard():
                importlib.import_module(name)
                outcomes[i] = "imported"
                deadline = time.monotonic() + 30  # then a loop without checks: interrupted once out of the import
                while time.monotonic() < deadline:
                    time.sleep(0.01)
        except BaseException as e:
            outcomes[i] = f"{outcomes[i]}, then {type(e).__name__}" if i in outcomes else type(e).__name__

    workers = []
    with pytest.raises(KeyboardInterrupt), threads.mapping():
        for i in range(3):  # one imports, the others wait on the module's lock
            workers.append(threading.Thread(target=contextvars.copy_context().run, args=(shard, i), daemon=True))
            workers[-1].start()
        deadline = time.monotonic() + 120  # each thread in the import (or past it: a slow start), however loaded
        while not all(i in outcomes or interrupts.importing(sys._current_frames().get(w.ident))
                      for i, w in enumerate(workers)) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise KeyboardInterrupt
    for w in workers:
        w.join(30)
    assert not any(w.is_alive() for w in workers), "a thread hangs on the module's import lock"
    assert outcomes == {i: "imported, then ShardsStopped" for i in range(3)}
    importlib.import_module(name)


def test_a_failure_of_the_main_thread_lets_the_shards_finish():
    """A failed shard fails the stage; the others in progress finish and stay done for the rerun."""
    assert run(ValueError("a shard failed"), ShardThreads(grace_s=0.2), checks=True) == ["finished"] * 3


def test_a_shard_starting_after_the_stop_does_not_start():
    """Prefect checks its own cancel flag before a task starts, but that is set only later, when the
    task runner exits: a shard whose thread was between the two went on to its end."""
    threads = ShardThreads(grace_s=0.2)
    threads.stop()
    with threads.mapping(), pytest.raises(ShardsStopped):
        contextvars.copy_context().run(work, threading.Event(), threading.Event(), True, False)


def test_outside_a_run_that_maps_shards_the_checks_do_nothing():
    stopping.check()
    stopping.sleep(0.01)
