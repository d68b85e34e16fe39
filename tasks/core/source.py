"""The digest of a stage's source code: part of every pass's fingerprint, so a changed stage is redone
by every runner, as `dvc repro` redoes it (dvc.yaml lists the same folders as the stage's deps).

Without it a pipeline run after a code change kept the old outputs (their markers matched the params
and inputs) and then recorded them in dvc.lock against the new code, so DVC took them as up to date too.

Python files count by their syntax tree without docstrings: editing a comment, a docstring or the
layout of a line redoes nothing; any other change does. Other files (CUDA sources, data) count by bytes.
__pycache__ is left out, as .dvcignore leaves it out of DVC's hash.
"""
from __future__ import annotations

import ast
import hashlib
import threading
import time
from pathlib import Path

# the folder holding tasks/, trainer/, kernels/: a stage names its folders relative to it
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _canonical(node) -> str:
    """The syntax tree as text, without empty or absent fields: ast.dump prints those, and Python 3.12
    added one to every function and class (type_params=[]), which would change every digest with the
    interpreter's version."""
    if isinstance(node, ast.AST):
        fields = [f"{k}={_canonical(v)}" for k, v in ast.iter_fields(node) if v is not None and v != []]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(x) for x in node) + "]"
    return repr(node)


_PARSING = threading.Lock()
MISMATCH = "AST constructor recursion depth mismatch"


def parse(data: bytes, filename: str, tries: int = 5) -> ast.AST:
    """ast.parse, safe beside other threads. CPython 3.11 keeps the AST constructor's recursion depth in
    state its threads share: a parse that another thread's parse interrupts (a garbage collection can
    switch threads mid-way) fails with a spurious SystemError (python/cpython#106905; a CI run's stage
    failed with it while Prefect's threads ran). This process's parses take turns, and one that meets
    another library's is tried again."""
    for _ in range(tries - 1):
        try:
            with _PARSING:
                return ast.parse(data, filename=filename)
        except SystemError as e:
            if MISMATCH not in str(e):
                raise
    with _PARSING:  # the last try: its error is raised
        return ast.parse(data, filename=filename)


def file_digest(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".py":
        try:
            return _canonical(_without_docstrings(parse(data, str(path)))).encode()
        except SyntaxError:  # not Python after all: its bytes
            pass
    return data


# a file's digest by its status: the folders of a process's stages overlap (tasks/core is in each), and a
# pipeline process digests them at its start and again at each stage's end; parsing each file once per
# process saves ~1 s a stage. A write changes st_ctime_ns, which no tool can set back, so an edit made
# while the process runs is still seen (changed_since_loaded); but timestamps advance in ticks (~4 ms on
# ext4), so a file written within RACY_S of its digest is digested again each time (git's "racily clean")
_HASHES: dict[tuple, bytes] = {}
RACY_S = 2.0


def _file_hash(path: Path) -> bytes:
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _HASHES:
        return _HASHES[key]
    digest = hashlib.sha256(file_digest(path)).digest()
    if time.time() - st.st_ctime > RACY_S:
        _HASHES[key] = digest
    return digest


def code_digest(folders: tuple[str, ...], root: Path | None = None) -> str:
    """One digest of every file under `folders` (folders or single files, relative to `root`, by default
    SOURCE_ROOT), by relative path and content."""
    root = SOURCE_ROOT if root is None else root
    h = hashlib.sha256()
    for folder in folders:
        base = root / folder
        if base.is_file():
            files = [base]
        elif base.is_dir():
            files = sorted(f for f in base.rglob("*") if f.is_file() and "__pycache__" not in f.parts
                           and f.suffix != ".pyc")
        else:
            raise ValueError(f"a stage's source folder {base} does not exist")
        for f in files:
            h.update(str(f.relative_to(root)).encode() + b"\0")
            h.update(_file_hash(f))
    return h.hexdigest()[:16]


# (source root, stage code folders) -> their digest when this process first asked: the code it loaded
_LOADED: dict[tuple[str, tuple[str, ...]], str] = {}


def loaded_code_digest(folders: tuple[str, ...]) -> str:
    """The digest of the code this process runs: computed the first time it asks, then kept. A process that
    runs several stages (flows.pipeline) asks for all of them as it starts. An edit made to a stage's code
    after that is never recorded as the code of what the run made: a stage whose code changed before it
    started refuses to start (much of its code would be imported only then: the trainer, the kernels,
    the evaluator, what ranks and worker processes import: a mix of old and new), and one whose code
    changed while it ran is left out of dvc.lock (flows.dvc_sync) or fails its command (tasks.__main__)."""
    key = (str(SOURCE_ROOT), folders)
    if key not in _LOADED:
        _LOADED[key] = code_digest(folders)
    return _LOADED[key]


def changed_since_loaded(folders: tuple[str, ...]) -> bool:
    """Whether the code on disk differs from the code this process loaded (loaded_code_digest)."""
    key = (str(SOURCE_ROOT), folders)
    return key in _LOADED and code_digest(folders) != _LOADED[key]
