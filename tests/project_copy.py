"""Copy the project (tracked + untracked-not-ignored files) into a fresh git repo for CLI tests."""
from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import BENCHMARKS, REPO


def project_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return [f for f in out if f and (REPO / f).is_file()]


@functools.cache
def warm_filter_cache() -> None:
    """Compile the filter's statistics into the repository's numba cache once per test process (when no
    test has yet), so that the copies take it instead of each compiling it."""
    import pyarrow as pa

    from tasks.filter.textstats import text_stats
    text_stats(pa.array(["One sentence here. Another one there!\n\nA new paragraph, with words."]), [2], [5])


def copy_project(dest: Path, **params_over) -> Path:
    for f in project_files():
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    # numba's compiled functions (cache=True) that the suite has built so far: its cache is keyed by the
    # source's path, so a copy would compile them again (~15-25 s per copy that runs filter and dedup);
    # each entry stays valid only while the copied source has the same mtime and size (copy2 keeps both),
    # and the filter's only beside its .depends stamp (tasks.core.numba_cache: without it, the ~10 s
    # compile of the filter's statistics ran again in every copy)
    warm_filter_cache()
    for f in [*REPO.glob("tasks/**/__pycache__/*.nb[ic]"), *REPO.glob("tasks/**/__pycache__/*.depends")]:
        (dest / f.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / f.relative_to(REPO))
    raw = yaml.safe_load((dest / "params.yaml").read_text())
    raw["paths"]["benchmarks_dir"] = str(BENCHMARKS)
    raw["sample"].update(n_warc_files=2, pages_per_warc=20, curated_docs_per_dataset=10)
    raw["download"]["n_files"] = 2
    raw["train"]["profiles"]["sample"]["schedule"]["train_tokens"] = 2048  # two steps: these tests are about the DAG, not training
    raw["evaluate"].update(limit=3, shots=["zero"])  # every task, 3 docs each, 0-shot (few-shot: unit tests)
    for k, v in params_over.items():
        raw[k].update(v)
    (dest / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-qm", "copy"], cwd=dest, check=True)
    return dest
