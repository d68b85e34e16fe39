"""constraints.txt (`make lock`, .ci/lock.py) pins what `make install` takes: every requirement of
pyproject.toml must have a pin, and the pin must satisfy it, or a clean install fails (a changed range
without a new lock) or quietly runs on versions the suite never saw (a requirement left unpinned)."""
from __future__ import annotations

import importlib.util
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO


def lock_module():
    spec = importlib.util.spec_from_file_location("lock", REPO / ".ci" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pinned() -> dict[str, str]:
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            assert canonicalize_name(name) == name, f"{line}: not pip's canonical name"
            assert name not in out, f"{name} pinned twice"
            out[name] = version
    return out


def test_every_requirement_of_pyproject_is_pinned_within_its_range():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = pinned()
    for text in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{text}: not in constraints.txt (run `make lock`)"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{text}: constraints.txt pins {pins[name]} (run `make lock`)"
    assert pins["torch"] == "2.13.0", "torch without its local label, so PyPI's CUDA build matches too"
    assert "pip" in pins, "pip unpinned: `make install` would upgrade it to whatever was released last"


def test_pins_come_from_pips_report_by_canonical_name_without_local_labels_or_the_project():
    assert lock_module().canonical("Zope.Interface__x") == canonicalize_name("Zope.Interface__x")
    report = {"install": [  # the fields of `pip install --report` that the lock reads
        {"metadata": {"name": "mtnlg-repro", "version": "0.1.0"}},
        {"metadata": {"name": "SQLAlchemy", "version": "2.0.58"}},
        {"metadata": {"name": "torch", "version": "2.13.0+cpu"}},
        {"metadata": {"name": "aiohttp_retry", "version": "2.9.1"}},
        {"metadata": {"name": "aiohttp", "version": "3.14.5"}},
    ]}
    assert lock_module().pins(report, "26.3") == ["aiohttp==3.14.5", "aiohttp-retry==2.9.1", "pip==26.3",
                                                  "sqlalchemy==2.0.58", "torch==2.13.0"]
