"""`make docs` / `make ui` serve Data Docs from params.yaml's paths (flows.docs_server): the folder under
data_dir at the port of docs_url, which is what the artifacts link to, its index listing every stage's site."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import yaml

from tests.conftest import REPO, free_port


def start(tmp_path, docs_url: str) -> subprocess.Popen:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"paths": {"data_dir": str(tmp_path / "elsewhere"), "docs_url": docs_url}}))
    return subprocess.Popen([sys.executable, "-m", "flows.docs_server", "--params", "params.yaml"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def test_docs_are_served_from_the_data_dir_at_the_port_of_docs_url(tmp_path):
    port = free_port()
    # a site DVC restored: its summary, no index listing it yet
    (tmp_path / "elsewhere/docs/dedup").mkdir(parents=True)
    (tmp_path / "elsewhere/docs/dedup/summary.json").write_text(json.dumps(
        {"stage": "dedup", "success": True, "expectations": 9, "batches": 1, "failures": 0, "validated_at": "then"}))
    proc = start(tmp_path, f"http://127.0.0.1:{port}/")
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert line.startswith(f"Data Docs: http://127.0.0.1:{port}/index.html"), (line, proc.stderr.read())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=30) as r:
            page = r.read().decode()
        assert '<a href="dedup/index.html">dedup</a></td><td>passed</td><td>9</td>' in page
        taken = start(tmp_path / "elsewhere", f"http://127.0.0.1:{port}")  # the port is in use now
        assert taken.wait(timeout=120) == 1 and taken.stderr.read().strip().splitlines() == [
            f"I/O error: Address already in use (EADDRINUSE): port {port} of paths.docs_url is taken (another "
            "`make docs`/`make ui`?); free it or change it"]  # it named neither (an operator drill)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def test_a_docs_url_without_a_port_is_refused_in_one_line(tmp_path):
    proc = start(tmp_path, "https://docs.example.org/mtnlg")
    assert proc.wait(timeout=120) == 2
    assert proc.stderr.read().strip().splitlines() == [
        "configuration error: paths.docs_url 'https://docs.example.org/mtnlg' names no port: it points at a "
        f"server of yours; serve {tmp_path / 'elsewhere/docs'} there, or give http://127.0.0.1:<port>"]
