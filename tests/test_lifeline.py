"""tasks.core.lifeline: how a process is told gone (the ranks' and the session watcher's test)."""
from __future__ import annotations

import os
import signal
import subprocess
import time

from tasks.core import lifeline


def test_a_killed_process_is_gone_even_before_its_parent_reaps_it():
    child = subprocess.Popen(["sleep", "60"])
    me = lifeline.identity(child.pid)
    assert not lifeline.gone(me)
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not lifeline.gone(me) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lifeline.gone(me)
    assert open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"  # not reaped yet
    child.wait()
    assert lifeline.gone(me)


def test_a_reused_pid_or_another_machine_is_not_the_process():
    me = lifeline.identity(os.getpid())
    machine, pid, started = me.rsplit(":", 2)
    assert not lifeline.gone(me)
    assert lifeline.gone(f"{machine}:{pid}:{int(started) + 1}")  # same pid, another start: reused
    assert not lifeline.gone(f"another-boot/4026531836:{pid}:{started}")  # cannot be told: not gone
    assert not lifeline.gone("another-boot/1:999999999:1")


def test_the_dvc_a_stage_runs_under_is_found_however_dvc_was_started(tmp_path):
    """`dvc repro` starts the stage command through a shell (sh does not exec it): the stage looks a few
    ancestors up for dvc, started as its entry script or as `python -m dvc`."""
    import sys
    from tests.conftest import REPO
    probe = f"import sys; sys.path.insert(0, {str(REPO)!r}); from tasks.core import lifeline; print(lifeline.ancestor_running('dvc'))"
    (tmp_path / "dvc").mkdir()  # a stand-in `dvc` package, found first from its folder
    (tmp_path / "dvc" / "__init__.py").write_text("")  # a regular package: the installed dvc would win over a namespace one
    (tmp_path / "dvc" / "__main__.py").write_text(
        "import os, subprocess, sys\n"
        f"subprocess.run(['sh', '-c', {sys.executable!r} + ' -c \"$PROBE\"; true'], env={{**os.environ, 'PROBE': {probe!r}}})\n"
        "print(os.getpid())\n")
    out = subprocess.run([sys.executable, "-m", "dvc"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    found, dvc = out.stdout.split()
    assert found == dvc, out
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None", out  # no dvc above: nothing to watch
