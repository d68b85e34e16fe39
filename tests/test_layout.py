"""The registry is the DAG: dvc.yaml, the Prefect flows, the CLI and the validation suites follow it,
and `tasks/` shows one package per stage."""
from __future__ import annotations

import importlib

import yaml

from tasks.core.registry import PIPELINE, STAGES
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
        # the source folders a change of which redoes the stage: the same for DVC and for every runner
        assert tuple(x for x in d["deps"] if not x.startswith("data/")) == st.code, st.name
        metrics = [next(iter(m)) for m in d.get("metrics", [])]
        assert f"data/{st.name}/stats.json" in metrics
        assert STAGE_FLOWS[st.name].name == f"stage-{st.name}"
        if st.suite is not None:
            suite = importlib.import_module(st.suite)
            assert callable(suite.expectations) and callable(suite.batches)
    inputs = {st.name: st.input for st in STAGES}
    from tasks.core.config import PipelineParams

    p = PipelineParams()
    order = list(PIPELINE)
    for name, input_of in inputs.items():  # every input stage comes earlier in the DAG
        src = input_of(p)
        assert src is None or order.index(src) < order.index(name)
