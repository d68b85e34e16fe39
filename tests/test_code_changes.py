"""A change to a stage's code redoes the stage in every runner, as `dvc repro` does (tasks.core.source);
a comment, a docstring or a line's layout does not. Before, a pipeline run after a code change kept the
old outputs and recorded them in dvc.lock against the new code."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tasks.core import source
from tasks.core.config import parse_params
from tasks.core.runner import run_stage
from tests.conftest import small_raw

MODULE = '''"""What it does."""
import os


def f(x):
    """Twice x."""
    return 2 * x  # doubled
'''


def digest_after(tmp_path: Path, text: str, name: str = "m.py") -> str:
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / name).write_text(text)
    return source.code_digest(("pkg",), tmp_path)


def test_comments_docstrings_and_layout_do_not_count_statements_do(tmp_path):
    first = digest_after(tmp_path, MODULE)
    same = MODULE.replace("What it does.", "What it does, said again.").replace("Twice x.", "Doubles.") \
        .replace("# doubled", "# times two").replace("return 2 * x", "return (2 *\n            x)")
    assert digest_after(tmp_path, same) == first
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"compiled")
    assert source.code_digest(("pkg",), tmp_path) == first  # as .dvcignore leaves it out
    assert digest_after(tmp_path, MODULE.replace("2 * x", "3 * x")) != first
    assert digest_after(tmp_path, MODULE.replace("return 2 * x", "return None")) != \
        digest_after(tmp_path, MODULE.replace("return 2 * x", "return"))
    assert digest_after(tmp_path, MODULE) == first
    assert digest_after(tmp_path, "__global__ void k() {}\n", "k.cu") != first  # other files by bytes
    with pytest.raises(ValueError, match="source folder .*missing-pkg does not exist"):
        source.code_digest(("missing-pkg",), tmp_path)


def test_an_edit_that_keeps_the_files_size_and_time_is_seen(tmp_path, monkeypatch):
    """A process digests each file once while its status stays (source._file_hash): an edit of the same
    length with its modification time set back (cp -p, rsync -t) still changes the digest, and so does one
    made within a tick of the file's timestamps (ext4's are ~4 ms coarse)."""
    import os
    first = digest_after(tmp_path, MODULE)
    f = tmp_path / "pkg" / "m.py"
    assert source.code_digest(("pkg",), tmp_path) == first  # written just now: digested again, not kept
    assert digest_after(tmp_path, MODULE.replace("2 * x", "4 * x")) != first  # within the same tick, likely
    monkeypatch.setattr(source, "RACY_S", -1.0)  # as for a file written long before: its digest is kept
    assert digest_after(tmp_path, MODULE) == first
    st = f.stat()
    probe = tmp_path / "probe"
    while probe.write_text("t") and probe.stat().st_ctime_ns == st.st_ctime_ns:
        pass  # the clock's next tick: the edit below gets another st_ctime_ns
    f.write_text(MODULE.replace("2 * x", "3 * x"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert source.code_digest(("pkg",), tmp_path) != first


def downloaded(tmp_path: Path) -> tuple[object, int]:
    """Sample and download run once: (the params, download's shard count)."""
    p = parse_params(small_raw(tmp_path / "data"))
    run_stage("sample", p)
    return p, run_stage("download", p)["shards"]


def test_a_stage_is_redone_after_a_change_to_its_code_only(tmp_path, copied_sources):
    src = copied_sources
    p, shards = downloaded(tmp_path)
    out = tmp_path / "data" / "download" / "shards"
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def redone() -> int:
        source._LOADED.clear()  # each run in a new process, as `python -m tasks` and each pipeline run
        st = run_stage("download", p)
        return 0 if st.get("up_to_date") else st["shards"] - st["resumed_shards"]

    assert redone() == 0  # nothing changed: nothing redone
    stage_py = src / "tasks" / "download" / "stage.py"
    text = stage_py.read_text()
    stage_py.write_text(text.replace('"""', '"""An edited docstring. ', 1) + "\n# a comment\n")
    assert redone() == 0
    (src / "tasks" / "extract" / "stage.py").write_text((src / "tasks" / "extract" / "stage.py").read_text()
                                                        + "\nANOTHER_STAGE = 1\n")
    assert redone() == 0  # another stage's code
    stage_py.write_text(text + "\nCHANGED = 1\n")
    assert redone() == shards  # its own code: every shard redone
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # (this change alters no output)
    assert redone() == 0


def test_a_stage_whose_code_changed_after_the_run_loaded_it_does_not_start(tmp_path, copied_sources):
    """A long pipeline run loads every stage's code as it starts. A stage's digest was read from disk when
    the stage began, so an edit made before then (while download ran for hours, say) was recorded as the
    code of outputs that the loaded modules made, with the new code's lazily imported modules (the trainer,
    the kernels, the evaluator) mixed in: the next run kept them. Now such a stage does not start; the
    next run, in a new process, runs the new code."""
    from tasks.core import registry
    from tasks.core.errors import CodeChanged
    src = copied_sources
    p, shards = downloaded(tmp_path)
    source._LOADED.clear()  # the next pipeline run's process, which loads the code as it starts
    code = registry.stage("download").code
    source.loaded_code_digest(code)
    stage_py = src / "tasks" / "download" / "stage.py"
    stage_py.write_text(stage_py.read_text() + "\nCHANGED = 1\n")  # while an earlier stage runs
    with pytest.raises(CodeChanged, match="stage 'download' cannot start: its code changed on disk after this run "
                                          "loaded it, and it would run a mix of old and new code: rerun"):
        run_stage("download", p)
    assert (tmp_path / "data" / "download" / "stats.json").is_file()  # refused before anything changed
    assert source.changed_since_loaded(code)  # so the pipeline does not record it in dvc.lock (test_dvc)
    source._LOADED.clear()  # the run after
    assert run_stage("download", p)["resumed_shards"] == 0


def test_the_stage_command_fails_when_its_code_changed_while_it_ran(tmp_path, copied_sources):
    """`dvc repro` hashes a stage's deps after its command: an edit made while `python -m tasks <stage>`
    ran was recorded in dvc.lock as the code of outputs the old code made. A failed command is not."""
    import os
    import subprocess
    import sys

    import yaml
    src = copied_sources
    p, shards = downloaded(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_raw(tmp_path / "data")))
    # the command runs the copy, whose validation first edits download's code: an edit while it runs
    validation = src / "tasks" / "validation" / "__init__.py"
    clean = validation.read_text()
    validation.write_text(clean + """
_validate = validate_stage


def validate_stage(stage, p):
    f = Path(__file__).parents[1] / "download" / "stage.py"
    f.write_text(f.read_text() + "\\nCHANGED = 1\\n")
    return _validate(stage, p)
""")

    def command() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tasks", "download"], cwd=tmp_path, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(src)}, timeout=600)

    out = command()
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == (
        "code changed: stage 'download' ran with the code it loaded, and its code changed on disk meanwhile: its "
        "outputs are the old code's, so this run must not be recorded; rerun `python -m tasks download`")
    validation.write_text(clean)
    out = command()  # the next run: the new code, so download is redone
    assert out.returncode == 0, out.stderr
    source._LOADED.clear()  # and recorded as the new code's: a run after it redoes nothing
    assert run_stage("download", p)["up_to_date"]


def test_the_digest_leaves_out_what_python_versions_add_empty():
    # Python 3.12's syntax tree gives every function and class an empty type_params field
    tree = ast.parse(MODULE)
    plain = source._canonical(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            node.type_params = []
            node._fields = (*node._fields, "type_params")
    assert source._canonical(tree) == plain


def test_a_parse_failed_by_another_threads_parse_is_tried_again(tmp_path, monkeypatch):
    """CPython 3.11's AST constructor shares its recursion depth between threads: a parse beside another
    can fail with a spurious SystemError (python/cpython#106905), which failed a stage in CI."""
    f = tmp_path / "m.py"
    f.write_text("x = 1\n")
    want, real, calls = source.file_digest(f), ast.parse, []

    def flaky(data, filename="<unknown>"):
        calls.append(filename)
        if len(calls) <= 2:
            raise SystemError("AST constructor recursion depth mismatch (before=39, after=72)")
        return real(data, filename=filename)
    monkeypatch.setattr(source.ast, "parse", flaky)
    assert source.file_digest(f) == want and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(source.ast, "parse", lambda *a, **k: (_ for _ in ()).throw(SystemError("another")))
    with pytest.raises(SystemError, match="another"):
        source.file_digest(f)
