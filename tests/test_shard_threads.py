"""An interrupt of the main thread stops the threads running a stage's shards (tasks/core/shard_threads.py,
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

from tasks.core.shard_threads import ShardThreads, running_shard
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


def test_a_second_interrupt_during_the_grace_interrupts_the_shards_at_once(monkeypatch):
    """Ctrl-C twice: the second ended the grace and with it the stop, so a shard that never checks was
    never interrupted and went on to its end (the process waits for it at exit)."""
    import ctypes
    main, in_grace = threading.get_ident(), threading.Event()
    running = ShardThreads._running
    # the grace loop asks whether shards still run: from there on the main thread is in the grace
    monkeypatch.setattr(ShardThreads, "_running", lambda self: in_grace.set() or running(self))

    def interrupt_the_grace() -> None:  # a KeyboardInterrupt in the main thread once it is in the grace
        if in_grace.wait(60):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(KeyboardInterrupt))

    second = threading.Thread(target=interrupt_the_grace, daemon=True)
    second.start()
    outcomes = run(KeyboardInterrupt(), ShardThreads(grace_s=120), checks=False)
    second.join()  # its exception has landed before the outcomes are judged
    assert outcomes == [ShardsStopped, ShardsStopped, "finished"]


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


def test_python_m_tasks_runs_a_passs_shards_in_threads_results_in_shard_order():
    """`python -m tasks` (and so `dvc repro`) ran shards one after another whatever runner.max_workers said:
    both shards must be in flight at once to pass the barrier."""
    from tasks.core.shard_threads import map_in_threads
    both = threading.Barrier(2, timeout=120)  # a guard against a hang, not a timing check

    def work(stage, pass_name, p, shard, ctx) -> dict:
        both.wait()
        return {"shard": shard, "thread": threading.current_thread().name}

    out = map_in_threads(2, work)("extract", "text", None, ["a", "b"], None)
    assert [r["shard"] for r in out] == ["a", "b"]
    assert all(r["thread"].startswith("extract.text") for r in out)
    assert map_in_threads(1, lambda *a: {"shard": a[3]})("extract", "text", None, ["a", "b"], None) == \
        [{"shard": "a"}, {"shard": "b"}]


def test_a_failed_shard_fails_the_pass_with_the_first_failure_in_shard_order():
    from tasks.core.shard_threads import map_in_threads
    second_failed = threading.Event()

    def work(stage, pass_name, p, shard, ctx) -> dict:
        if shard == 1:
            second_failed.set()
            raise ValueError("shard 1")
        assert second_failed.wait(120)  # shard 0 fails after shard 1 did
        raise ValueError("shard 0")

    with pytest.raises(ValueError, match="^shard 0$"):
        map_in_threads(2, work)("extract", "text", None, [0, 1], None)


def test_an_interrupt_of_the_command_stops_its_shard_threads(monkeypatch):
    """The signal goes to a shard's thread (os.kill, which Linux mostly gives the main thread, hung 1 run
    in about 10 on the mapper's former untimed wait and passed the rest), and only once the main thread
    waits on the shards: sent while it was still starting the second shard's thread, it ran there, and
    the test passed on that untimed wait."""
    import signal

    from tasks.core import shard_threads
    from tests.signalled_shards import SignalledShards, interrupt
    drill = SignalledShards()
    monkeypatch.setattr(shard_threads, "wait", drill.announcing(shard_threads.wait))
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        drill.signal_a_shard(signal.SIGUSR1)
        with pytest.raises(KeyboardInterrupt):
            shard_threads.map_in_threads(2, drill.work)("extract", "text", None, ["a", "b"], None)
    finally:
        drill.end()
        signal.signal(signal.SIGUSR1, previous)
    assert drill.outcomes == {"a": "stopped", "b": "stopped"}


def test_the_command_says_once_that_processes_and_dask_are_the_flows(capsys, monkeypatch):
    """Where it maps shards: said before any run's error too, it made a refusal two lines on stderr."""
    from tasks.__main__ import shard_mapper
    from tasks.core import runner
    from tasks.core.config import RunnerParams
    monkeypatch.setattr(runner, "process_shard", lambda stage, pass_name, p, shard, ctx: {"shard": shard})
    assert shard_mapper(RunnerParams(kind="threads"))("extract", "text", None, ["a", "b"], None) == \
        [{"shard": "a"}, {"shard": "b"}]
    assert capsys.readouterr().err == ""
    noting = shard_mapper(RunnerParams(kind="processes", max_workers=4))
    assert noting("sample", "corpus", None, [], None) == [] and capsys.readouterr().err == ""
    for _ in range(2):
        assert noting("extract", "text", None, ["a", "b"], None) == [{"shard": "a"}, {"shard": "b"}]
    assert capsys.readouterr().err == ("note: runner.kind processes applies to the Prefect flows; python -m tasks "
                                       "runs shards in 4 threads\n")
