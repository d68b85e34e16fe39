"""Write constraints.txt: the exact versions a clean install of this project resolves to today.

    python3 .ci/lock.py [--out constraints.txt]      (what `make lock` runs)

pip resolves pyproject.toml's dependencies and its test extra afresh (a dry run: nothing is installed,
and the current pins are not applied), and every package it would install is written as name==version.
It runs in a temporary venv with the newest pip, as `make install` does (pip 23 left out a package that
pip 26 installs: lxml's html_clean extra), not in .venv: after a change that the current pins refuse,
.venv cannot be installed until the lock is rewritten.
`make install` installs with them as pip constraints (they pin; they install nothing), so a clean clone
gets the environment the suite passed in, and an upstream release changes nothing until the lock is
rewritten: fastapi 0.151, SQLAlchemy 2.1 and prefect 3.9 each broke a clean install here once. torch
is written without its local label (+cpu): the machine's CPU wheel and PyPI's CUDA build both match.
pip itself is pinned too, at the version that resolved the lock: `make install` upgrades the venv's pip
to it first, so a pip release cannot change how a clean clone resolves or builds either."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "mtnlg-repro"
HEADER = """\
# Written by `make lock` (.ci/lock.py): every package a clean `pip install -e '.[test]'` resolved to,
# which `make install` takes as pip constraints. Change a dependency in pyproject.toml, then `make lock`.
"""


def canonical(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(report: dict, pip: str) -> list[str]:
    """name==version for each package of a `pip install --report`, this project left out, and for pip."""
    versions = {canonical(i["metadata"]["name"]): i["metadata"]["version"].split("+")[0]
                for i in report["install"]}
    versions["pip"] = pip
    return [f"{name}=={versions[name]}" for name in sorted(versions) if name != PROJECT]


def resolve(root: Path = ROOT) -> tuple[dict, str]:
    """pip's installation report for the project with its test extra, as a clean install would resolve it,
    and the version of the (newest) pip that resolved it."""
    with tempfile.TemporaryDirectory() as tmp:
        venv.create(Path(tmp) / "venv", with_pip=True)
        py, report = str(Path(tmp) / "venv" / "bin" / "python"), Path(tmp) / "report.json"
        subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-e", f"{root}[test]"], check=True)
        pip = subprocess.run([py, "-c", "import pip; print(pip.__version__)"], check=True,
                             capture_output=True, text=True).stdout.strip()
        return json.loads(report.read_text()), pip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "constraints.txt")
    args = ap.parse_args(argv)
    lines = pins(*resolve())
    args.out.write_text(HEADER + "\n".join(lines) + "\n")
    print(f"{args.out}: {len(lines)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
