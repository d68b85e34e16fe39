"""Launching with a hostfile (DeepSpeed's launcher), on one host and on two "nodes": the same losses as
torchrun's launch; a hostfile that does not match the layout is refused before anything starts.

Two nodes on one machine: a `pdsh` stand-in on PATH runs DeepSpeed's per-node command once per host
of `-w` with `%n` replaced by the host's index, as pdsh does over ssh; each node then starts its rank
through `deepspeed.launcher.launch`, and the two ranks meet at 127.0.0.1 as two nodes would."""
from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest

from tasks.core.errors import ConfigError
from trainer import launch
from trainer.config import LaunchParams
from trainer.run import launch as launch_run
from tests.test_train_loop import spec

PDSH = r'''#!/usr/bin/env bash
# pdsh stand-in: the command once per host of -w, here, with %n = the host's index; -S: the largest exit code
while [ $# -gt 0 ]; do
  case "$1" in -S) shift ;; -f) shift 2 ;; -w) hosts="$2"; shift 2 ;; *) break ;; esac
done
cmd="$*"; IFS=, read -ra names <<< "$hosts"; pids=(); i=0
for h in "${names[@]}"; do echo "$h" >> "$(dirname "$0")/started"; bash -c "${cmd//%n/$i}" & pids+=($!); i=$((i+1)); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
'''


def hostfile(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def torchrun_losses(tmp_path_factory) -> dict[int, float]:
    return launch_run(spec(tmp_path_factory.mktemp("torchrun"), steps=4), timeout=900)


def test_one_host_hostfile_runs_through_the_deepspeed_launcher(torchrun_losses, tmp_path):
    s = spec(tmp_path / "run", steps=4).model_copy(
        update={"launch": LaunchParams(hostfile=hostfile(tmp_path, "localhost slots=2\n"))})
    assert launch_run(s, timeout=900) == torchrun_losses
    assert "deepspeed.launcher.launch" in (tmp_path / "run" / "launch.log").read_text()


def test_two_nodes_through_pdsh_give_the_same_losses(torchrun_losses, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pdsh").write_text(PDSH)
    (bin_dir / "pdsh").chmod(0o755 | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hosts = hostfile(tmp_path, "# two DGX nodes, one rank each\nnode-a slots=1\nnode-b slots=1\n")
    s = spec(tmp_path / "run", steps=4).model_copy(
        update={"launch": LaunchParams(hostfile=hosts, master_addr="127.0.0.1")})
    assert launch_run(s, timeout=900) == torchrun_losses
    assert (bin_dir / "started").read_text().split() == ["node-a", "node-b"]
    env_file = (tmp_path / "run" / "deepspeed_env").read_text()
    assert "OMP_NUM_THREADS=1" in env_file and "DS_ACCELERATOR=" in env_file  # what pdsh carries to the nodes


@pytest.mark.parametrize("text,message", [
    ("node-a slots=1\n", r"has 1 slots on 1 host\(s\) but the layout has tp x pp x dp = 2 ranks"),
    ("node-a slots=1\nnode-b slots=2\n", r"has 3 slots on 2 host\(s\)"),
    ("node-a slots=two\n", "hostfile .*: .*`<host> slots=<ranks>`"),
    ("\n", "empty or not formatted correctly"),
])
def test_a_hostfile_that_does_not_fit_the_layout_is_refused(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        launch.check(LaunchParams(hostfile=hostfile(tmp_path, text)), 2)


def test_a_missing_hostfile_is_named(tmp_path):
    with pytest.raises(ConfigError, match="train.launch.hostfile .*nowhere: no such file"):
        launch.check(LaunchParams(hostfile=str(tmp_path / "nowhere")), 2)


def test_a_local_launch_leaves_the_port_to_torchrun(tmp_path):
    """A port found free here and bound by torchrun later could be taken in between on a busy machine: the
    local launch lets torchrun's rendezvous bind a free one itself; a port or address given is used."""
    cmd = launch.command("trainer.run", tmp_path / "run.json", 2)
    assert "--standalone" in cmd and not any(a.startswith("--master") for a in cmd)
    cmd = launch.command("trainer.run", tmp_path / "run.json", 2, LaunchParams(master_port=29511))
    assert "--standalone" not in cmd and cmd[cmd.index("--master-port") + 1] == "29511"
    cmd = launch.command("trainer.run", tmp_path / "run.json", 2, LaunchParams(master_addr="10.0.0.1"))
    assert cmd[cmd.index("--master-addr") + 1] == "10.0.0.1" and "--master-port" in cmd


def test_the_echoed_output_ends_its_last_line(tmp_path):
    """A progress bar redraws its line with \\r and no newline: the `interrupted: ...` line after Ctrl-C (or an
    error line) was glued to its end."""
    import io

    from trainer.launch import _run_echoing
    echo = io.BytesIO()
    bar = "import sys; sys.stdout.write('train  50%|#####     | 100/200 [00:01<00:01]\\r'); sys.stdout.flush()"
    assert _run_echoing([sys.executable, "-c", bar], tmp_path / "launch.log", echo, None) == 0
    assert echo.getvalue().endswith(b"00:01]\r\n")
    echo = io.BytesIO()
    assert _run_echoing([sys.executable, "-c", "print('done')"], tmp_path / "launch.log", echo, None) == 0
    assert echo.getvalue() == b"done\n"  # a complete last line gets nothing more


def test_torchruns_failure_report_stays_in_the_log(tmp_path):
    """After a rank's one-line error, torchrun printed its own ~30-line report (a launcher traceback and a box
    of exit codes) to the console, between the rank's line and the stage's."""
    import io

    from trainer.launch import _run_echoing
    report = ("E1125 17:27:25.159000 24881 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) "
              "local_rank: 0 (pid: 24885) of binary: python\\nTraceback (most recent call last):\\n  File ...\\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\\n=====\\ntrainer.run FAILED\\n")
    code = (f"import sys, time; print('input file error: checkpoint file x cannot be read', flush=True); "
            f"time.sleep(0.2); sys.stdout.write('{report}'); sys.exit(1)")
    echo = io.BytesIO()
    assert _run_echoing([sys.executable, "-c", code], tmp_path / "launch.log", echo, None) == 1
    assert echo.getvalue() == b"input file error: checkpoint file x cannot be read\n"
    logged = (tmp_path / "launch.log").read_text()
    assert "input file error" in logged and "ChildFailedError" in logged and "trainer.run FAILED" in logged


@pytest.mark.parametrize("cut", [1, 3, 40])
def test_a_report_line_split_across_reads_echoes_none_of_it(tmp_path, cut):
    """A read that ended inside the report's first line echoed that line's first bytes ("E1125 17:2")."""
    from trainer.launch import _split_echo
    line = (b"E1125 17:27:25.159000 24881 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
            b"(exitcode: 2) local_rank: 0\nTraceback (most recent call last):\n")
    before = b"input file error: checkpoint file x cannot be read\n"
    shown, held, muted = _split_echo(b"", before + line[:cut])
    assert (shown, held, muted) == (before, line[:cut], False)
    shown, held, muted = _split_echo(before, held + line[cut:])
    assert (shown, held, muted) == (b"", b"", True)
    # a line that only began like one is echoed once it ends, or when the output ends (the caller echoes `held`)
    assert _split_echo(before, b"E1125 a warning\nnext") == (b"E1125 a warning\nnext", b"", False)
    assert _split_echo(b"", b"train: DONE\n") == (b"train: DONE\n", b"", False)
    # a rank killed mid-step leaves its progress bar's line unfinished (tqdm redraws it after a \r): the report
    # goes on from there
    bar = b"\rtrain:  40%|####      | 4/10 [00:01<00:01]\rtrain:  50%|#####     | 5/10 [00:01<00:01]"
    assert _split_echo(b"", bar + line[:cut]) == (bar, line[:cut], False)
    assert _split_echo(bar, line) == (b"", b"", True)


def _echoed(stream: bytes, size: int) -> bytes:
    """What the console gets of `stream` read `size` bytes at a time, as _run_echoing feeds _split_echo."""
    from trainer.launch import _split_echo
    tail, held, shown_all, muted = b"", b"", b"", False
    for i in range(0, len(stream), size):
        if not muted:
            shown, held, muted = _split_echo(tail, held + stream[i:i + size])
            tail, shown_all = (tail + shown)[-512:], shown_all + shown
    return shown_all + (held if not muted else b"")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 13, 64, 65536])
def test_whatever_the_reads_the_console_gets_all_but_the_report(size):
    error = b"input file error: checkpoint file x cannot be read\n"
    bar = b"\rtrain:  50%|#####     | 5/10 [00:01<00:01, E2 3.2it/s]"
    glog = b"E1125 17:27:24.000000 24881 some/other.py:12] not the report\n"
    report = (b"E1125 17:27:25.159000 24881 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
              b"(exitcode: 2) local_rank: 0\nTraceback (most recent call last):\n  File ...\n")
    for shown in (glog + error, glog + bar, bar + b"\n" + glog + error):
        assert _echoed(shown + report, size) == shown
        assert _echoed(shown, size) == shown


def stand_in(tmp_path: Path, what: str) -> Path:
    """The file that tells tests.launch_targets what its rank does; the launch's folder is its folder."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.json"
    path.write_text(what, encoding="utf-8")
    return path


def test_a_resumed_runs_failure_is_named_by_its_own_line_not_the_run_befores(tmp_path):
    """A resumed run appends to the launch log of the run before: its first labelled line, the earlier
    failure's, was reported for every later failure (fixed disk space, then a NaN: still "no space left")."""
    import io
    log = tmp_path / "launch.log"
    config = stand_in(tmp_path, "say I/O error: [Errno 28] No space left on device: 'checkpoints/step-40'")
    with pytest.raises(launch.LaunchFailed, match="No space left on device"):
        launch.run("tests.launch_targets", config, 1, log, timeout=300, echo=io.BytesIO())
    stand_in(tmp_path, "say training failed: the loss is NaN at step 57")
    for echo in (io.BytesIO(), None):
        with pytest.raises(launch.LaunchFailed) as failed:
            launch.run("tests.launch_targets", config, 1, log, timeout=300, echo=echo)
        assert failed.value.line == "training failed: the loss is NaN at step 57"
    assert "No space left on device" in log.read_text()  # the log keeps both runs


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path):
    """The out-of-memory killer's SIGKILL leaves no line of the rank's own: the error was the first line holding
    "error", a frame of torchrun's traceback (`File ".../multiprocessing/errors/__init__.py", line 367`)."""
    import io
    with pytest.raises(launch.LaunchFailed) as failed:
        launch.run("tests.launch_targets", stand_in(tmp_path, "killed"), 1, tmp_path / "launch.log", timeout=300,
                   echo=io.BytesIO())
    assert re.fullmatch(r"rank 0 \(local rank, pid \d+\) was killed by SIGKILL \(the kernel's out-of-memory killer, "
                        r"or kill -9\)", failed.value.line), failed.value.line


def test_the_time_limit_is_named_whether_the_output_is_echoed_or_not(tmp_path):
    """The train stage echoes the ranks' output: its time limit stopped torchrun, which exits 1 as for a failed
    rank, and the stage reported a frame of torchrun's traceback as the training's error."""
    import io
    for echo in (io.BytesIO(), None):
        with pytest.raises(launch.LaunchTimedOut, match=r"every rank was stopped after the launch's time limit of 2 s"):
            launch.run("tests.launch_targets", stand_in(tmp_path / str(echo is None), "busy"), 1,
                       tmp_path / "launch.log", timeout=2, echo=echo)
        # an operator drill: what torchrun printed of its own stop (a SignalException traceback, ~40 lines) was
        # echoed before the stage's line; it stays in launch.log
        assert echo is None or b"SignalException" not in echo.getvalue(), echo.getvalue().decode()[-2000:]
    assert b"SignalException" in (tmp_path / "launch.log").read_bytes()
    from tasks.core import lifeline
    assert not lifeline.launched_pids()


TORCHRUN_REPORT = """\
E1128 03:04:51.782000 31521 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) \
local_rank: {rank} (pid: 31526) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  traceback : Signal 9 (SIGKILL) received by PID 31526
"""


@pytest.mark.parametrize("text,line", [
    # the rank killed first; the others' errors are only their lost peer
    ("rank up\nerror: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
     + TORCHRUN_REPORT.format(code=-9, rank=1),
     "rank 1 (local rank, pid 31526) was killed by SIGKILL (the kernel's out-of-memory killer, or kill -9)"),
    ("W1128 Sending process 31527 closing signal SIGTERM\n" + TORCHRUN_REPORT.format(code=-11, rank=0),
     "rank 0 (local rank, pid 31526) was killed by SIGSEGV (a crash in native code)"),
    # a rank's own line wins over a traceback's frames that hold "error"
    ('  File "/x/tasks/core/errors.py", line 3, in f\nconfiguration error: profile \'x\' needs 80 GiB\n'
     + TORCHRUN_REPORT.format(code=2, rank=0), "configuration error: profile 'x' needs 80 GiB"),
    # a traceback the rank did not catch (an import that failed): its last line
    ('Traceback (most recent call last):\n  File "/x/trainer/errors_seen.py", line 1, in <module>\n'
     "ModuleNotFoundError: No module named 'cupy_backends'\n" + TORCHRUN_REPORT.format(code=1, rank=0),
     "ModuleNotFoundError: No module named 'cupy_backends'"),
    ("rank up\n" + TORCHRUN_REPORT.format(code=3, rank=0), "rank 0 exited with code 3 and no error line"),
    # several hosts through pdsh: `<host>: ` before every line
    ("node1: rank up\nnode2: configuration error: profile 'mtnlg' needs 80 GiB per GPU\n"
     "node2: [launch.py:259:sigkill_handler] ['python', '-u'] exits with return code = 2\n",
     "configuration error: profile 'mtnlg' needs 80 GiB per GPU (on node2)"),
    ("node1: rank up\nnode2: [launch.py:259:sigkill_handler] ['python', '-u'] exits with return code = -9\n",
     "a rank on node2 was killed by SIGKILL (the kernel's out-of-memory killer, or kill -9)"),
])
def test_the_error_of_a_failed_launch_is_read_from_its_log(tmp_path, text, line):
    log = tmp_path / "launch.log"
    log.write_text(text)
    assert launch.first_error(log) == line


def test_every_rank_runs_one_thread_whatever_the_callers_mkl_setting(tmp_path, monkeypatch):
    """A determinism drill: torch reads MKL_NUM_THREADS after OMP_NUM_THREADS and the later wins, so a job script's
    MKL_NUM_THREADS=4 gave each rank 2 threads: other reduction orders, other checkpoint bytes and losses."""
    monkeypatch.setenv("MKL_NUM_THREADS", "4")
    env = launch.environment(tmp_path / "launch.log")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert "MKL_NUM_THREADS=1" in (tmp_path / "deepspeed_env").read_text().splitlines()  # the other hosts' too


def test_a_rank_reads_run_json_as_the_stage_wrote_it(tmp_path):
    """A determinism drill: under a Latin-1 locale a rank read run.json (UTF-8) in the locale's encoding, took a
    project path with an 'é' for another folder and failed. Python warns of a read without an encoding."""
    import json
    import subprocess
    from trainer.run import RunSpec
    folder = tmp_path / "projet_é"
    folder.mkdir()
    run_json = folder / "run.json"
    run_json.write_text(spec(folder / "out").model_dump_json(), encoding="utf-8")
    code = ("import sys, trainer.run as r; s = r.read_spec(sys.argv[1]); print(s.out)")
    out = subprocess.run([sys.executable, "-X", "warn_default_encoding", "-W", "error::EncodingWarning", "-c", code,
                          str(run_json)], capture_output=True, text=True, encoding="utf-8",
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(folder / "out") == RunSpec.model_validate(json.loads(run_json.read_text("utf-8"))).out
