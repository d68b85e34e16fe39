"""The registry is the DAG: dvc.yaml, the Prefect flows, the CLI and the validation suites follow it,
and `tasks/` shows one package per stage."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import yaml

from tasks.core.registry import PIPELINE, STAGES
from tasks.core.runner import VALIDATION_CODE
from tasks.core.stage import GlobalPass, ShardedPass
from tests.conftest import REPO


def test_tasks_folder_shows_the_dag():
    packages = {p.name for p in (REPO / "tasks").iterdir() if (p / "__init__.py").is_file()}
    assert set(PIPELINE) <= packages
    assert {"core", "validation", "evalsets"} <= packages
    loose = {p.name for p in (REPO / "tasks").glob("*.py")}
    assert loose <= {"__init__.py", "__main__.py"}, loose


def test_every_stage_is_declared_and_has_a_dvc_stage_a_flow_and_a_suite():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(dvc) == list(PIPELINE)
    from flows.stages import STAGE_FLOWS

    for st in STAGES:
        assert st.passes and all(isinstance(p, (ShardedPass, GlobalPass)) for p in st.passes)
        d = dvc[st.name]
        assert d["cmd"] == f"python -m tasks {st.name}"
        assert st.section in d["params"]
        assert str(st.outputs("data")) in d["outs"]
        assert (f"data/docs/{st.name}" in d["outs"]) == (st.suite is not None)  # restored with the outputs
        # the source folders a change of which redoes the stage: the same for DVC and for every runner (the
        # suites count in a validated stage's key: changed, dvc repro did not run the stage, and they stood)
        suites = (VALIDATION_CODE,) if st.suite is not None else ()
        assert tuple(x for x in d["deps"] if not x.startswith(("data/", "${"))) == st.code + suites, st.name
        # a stage that reads the task files depends on them, not only on their folder's name: edited, they
        # rerun it under `dvc repro` too (its passes' fingerprints count them already)
        assert ("paths.benchmarks_dir" in d["params"]) == ("${paths.benchmarks_dir}" in d["deps"]), st.name
        metrics = [m if isinstance(m, str) else next(iter(m)) for m in d.get("metrics", [])]
        assert f"data/{st.name}/stats.json" in metrics
        for ps in st.passes:  # a folder restored without its marker (dvc pull) was built again
            folder = str(st.pass_root("data", ps))
            if isinstance(ps, GlobalPass) and folder in d["outs"]:
                assert f"{folder}.done.json" in d["outs"], f"{st.name}: {folder}.done.json is not a DVC out"
            if isinstance(ps, ShardedPass) and f"{folder}/shards" in d["outs"]:
                assert f"{folder}/completions" in d["outs"], f"{st.name}: {folder}/completions is not a DVC out"
        # in the DVC cache, so `dvc pull` brings them: data/ is not in git, and a stage without its
        # stats.json is not complete (the next stage refuses it; `dvc status` calls it deleted)
        for entry in d.get("metrics", []) + d.get("plots", []):
            (path, options), = (entry if isinstance(entry, dict) else {entry: {}}).items()
            assert (options or {}).get("cache", True), f"{st.name}: {path} has cache: false"
        assert STAGE_FLOWS[st.name].name == f"stage-{st.name}"
        if st.suite is not None:
            suite = importlib.import_module(st.suite)
            assert callable(suite.expectations) and callable(suite.batches)
            # facts about the whole output: both hooks or neither (validate_stage checks them when `totals` is there)
            assert hasattr(suite, "totals") == hasattr(suite, "totals_expectations"), st.suite
    inputs = {st.name: st.input for st in STAGES}
    from tasks.core.config import PipelineParams

    p = PipelineParams()
    order = list(PIPELINE)
    for name, input_of in inputs.items():  # every input stage comes earlier in the DAG
        src = input_of(p)
        assert src is None or order.index(src) < order.index(name)


def imported_source_files(files: list[Path]) -> set[str]:
    """Every file of this project that `files` import, directly or not (tasks/core and tasks/validation
    aside: the shared contract is not part of a stage's code, by design)."""
    seen, todo, found = set(files), list(files), set()
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                if name.split(".")[0] not in ("tasks", "trainer", "kernels", "flows"):
                    continue
                base = REPO.joinpath(*name.split("."))
                f = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
                rel = str(f.relative_to(REPO))
                if f.is_file() and f not in seen and not rel.startswith(("tasks/core/", "tasks/validation/")):
                    seen.add(f)
                    todo.append(f)
                    found.add(rel)
    return found


def test_a_stages_code_holds_everything_it_imports():
    # else a change to code a stage runs (the GPT that evaluate scores with, the hashing dedup shares with
    # decontaminate) would not redo it, and DVC would not see it either
    for st in STAGES:
        own = [f for c in st.code for f in ([REPO / c] if (REPO / c).is_file() else (REPO / c).rglob("*.py"))
               if "__pycache__" not in f.parts]
        covered = {str(f.relative_to(REPO)) for f in own}
        missing = sorted(imported_source_files(own) - covered)
        assert not missing, f"stage {st.name} imports {missing}: add them to its code and dvc.yaml deps"
