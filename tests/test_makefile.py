"""The Makefile's commands work from a checkout whose path has spaces (e.g. ~/My Projects/mtnlg): an
unquoted PATH=$(CURDIR)/... split there, and the shell ran the rest of the path as a command."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.conftest import REPO

FAKE = """#!/bin/sh
echo "first PATH entry: ${PATH%%:*}"
echo "ran: $(basename "$0") $*"
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target, ran", [("run", "python -m flows.pipeline params.yaml"), ("repro", "dvc repro"),
                                         ("test", "python -m pytest")])
def test_make_targets_run_from_a_path_with_spaces(tmp_path, target, ran):
    root = tmp_path / "My Projects" / "mt nlg"
    (root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", root / "Makefile")
    for name in ("pyproject.toml", "constraints.txt"):  # what the install stamp depends on
        shutil.copy(REPO / name, root / name)
    for name in ("python", "dvc"):  # stand-ins that say how they were started
        (root / ".venv" / "bin" / name).write_text(FAKE)
        (root / ".venv" / "bin" / name).chmod(0o755)
    stamp = root / ".venv" / ".installed-stamp"
    stamp.touch()
    later = time.time() + 60
    os.utime(stamp, (later, later))  # installed after pyproject.toml changed: make installs nothing
    out = subprocess.run(["make", "-s", target], cwd=root, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "MAKEFLAGS": ""})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"first PATH entry: {root}/.venv/bin" in out.stdout, out.stdout
    assert f"ran: {ran}" in out.stdout, out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_install_takes_every_package_pip_included_at_its_pin(tmp_path):
    """An unpinned `pip install --upgrade pip` gave a clean clone whatever pip was released last."""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / ".venv" / "bin" / "python").write_text(FAKE)
    (tmp_path / ".venv" / "bin" / "python").chmod(0o755)
    out = subprocess.run(["make", "-s", "install"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "MAKEFLAGS": ""})
    assert out.returncode == 0, out.stdout + out.stderr
    installs = [line for line in out.stdout.splitlines() if line.startswith("ran: python -m pip install")]
    assert any(line.endswith(" pip") for line in installs), out.stdout
    assert installs and all("-c constraints.txt" in line for line in installs), out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_gpu_check_stops_with_one_line_where_there_is_no_gpu():
    """Without a GPU the kernel tests skip and pytest exits 0: gpu-check must not pass for a GPU run."""
    import kernels
    if kernels.fused_available():
        pytest.skip("a GPU is here")
    out = subprocess.run(["make", "-s", "gpu-check", f"PY={REPO / '.venv' / 'bin' / 'python'}", "GPU_LOGS=/nonexistent/x"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "MAKEFLAGS": ""})
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[0] == "gpu-check: no CUDA GPU with CuPy here", out.stderr
