"""The recurring evaluation as Prefect runs it: the scheduled deployment from prefect.yaml against a real
server on 127.0.0.1 (run as the UI's Run button does), the server's scheduler creating the runs, and
`python -m flows.eval_schedule`'s one-line refusals."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

from tasks.evaluate import history
from tests.conftest import REPO, prefect_server
from tests.project_copy import copy_project
from tests.test_eval_history import make_run
from tests.test_prefect import BIN, api, run


def test_scheduled_deployment_runs_on_a_server(server, tmp_path):
    # another paths.data_dir than data/: the flow's checkpoint and history folders follow it
    repo = copy_project(tmp_path / "repo", evaluate={"tasks": ["boolq", "hans"], "shots": ["zero"], "limit": 4},
                        paths={"data_dir": "runs/a"})
    data = repo / "runs" / "a"
    make_run(data / "tmp")
    (data / "tokenize").mkdir(parents=True)
    (data / "tmp" / "tokenizer").rename(data / "tokenize" / "tokenizer")
    (data / "train" / "work").mkdir(parents=True)
    (data / "tmp" / "checkpoints").rename(data / "train" / "work" / "checkpoints")
    # the run before, moved aside by another run with a checkpoint not yet evaluated: evaluated after the current's
    before = data / "train" / "work.previous" / "checkpoints" / "step-00000040"
    shutil.copytree(data / "train" / "work" / "checkpoints" / "step-00000020", before)
    meta = json.loads((before / "meta.json").read_text())
    (before / "meta.json").write_text(json.dumps({**meta, "step": 40, "run": "the run before"}))
    prefect = str(BIN / "prefect")
    run([prefect, "work-pool", "create", "local-process", "--type", "process", "--overwrite"], repo, server)
    run([prefect, "--no-prompt", "deploy", "--all"], repo, {**server, "PWD": str(repo)})
    dep = api(server, "/deployments/name/evaluate-checkpoints/recurring")
    schedules = api(server, f"/deployments/{dep['id']}/schedules")
    assert [s["schedule"]["cron"] for s in schedules] == ["*/30 * * * *"] and all(s["active"] for s in schedules)
    for expected_new in (3, 0):  # the second run finds nothing new: idempotent
        flow_run = api(server, f"/deployments/{dep['id']}/create_flow_run", {})  # what the UI's Run button posts
        out = run([prefect, "worker", "start", "--pool", "local-process", "--run-once"], repo, server)
        state = api(server, f"/flow_runs/{flow_run['id']}")
        assert state["state_type"] == "COMPLETED", (state["state_type"], state.get("state", {}).get("message"), out[-3000:])
        lines = (data / "evaluate/history/history.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [10, 20, 40]
    assert json.loads(lines[2])["run"] == "the run before"
    arts = api(server, "/artifacts/filter", {"artifacts": {"key": {"any_": ["evaluation-history"]}}})
    assert any("3 checkpoints, 0 new" in a["data"] and "| boolq/0-shot | hans/0-shot |" in a["data"] for a in arts)
    first = json.loads(lines[0])
    results = json.loads((data / "evaluate/history" / first["results"]).read_text())
    assert re.fullmatch(r"[0-9a-f-]{36}", results["provenance"]["prefect_flow_run_id"] or "")


def test_the_command_refuses_a_bad_params_file_in_one_line_before_any_server(tmp_path):
    """It printed Prefect's 30-line report of the flow's exception, after starting a temporary server."""
    (tmp_path / "params.yaml").write_text("evaluate: {taks: [boolq]}\n")
    for args, line in (([str(tmp_path / "nope.yaml")], "configuration error: "),
                       ([str(tmp_path / "params.yaml")], f"configuration error: {tmp_path}/params.yaml: evaluate.taks: ")):
        out = subprocess.run([sys.executable, "-m", "flows.eval_schedule", *args], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and out.stderr.startswith(line), out.stderr
        assert "temporary server" not in out.stdout + out.stderr


def test_the_command_meeting_another_evaluation_says_so_in_one_line(tmp_path, server):
    """Its line came after Prefect's 23-line report of the flow's exception, which the UI's run log showed as
    well (an operator drill: a command-line pass while a scheduled run evaluated)."""
    repo = copy_project(tmp_path / "repo")
    with history._lock(repo / "data" / "evaluate" / "history"):  # the other evaluation, in progress
        out = subprocess.run([sys.executable, "-m", "flows.eval_schedule", "params.yaml"], cwd=repo, env=server,
                             capture_output=True, text=True, timeout=300)
    line = "stage busy: another evaluation of data/evaluate/history is running"
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == line, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr


SCHEDULE_CHECK = """
import asyncio, datetime, sys, time
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.schedules import IntervalSchedule

async def main():
    async with get_client() as c:
        flow = await c.create_flow_from_name("schedule-check")
        every = IntervalSchedule(interval=datetime.timedelta(minutes=30))
        dep = await c.create_deployment(flow_id=flow, name="recurring", entrypoint="none.py:none",
                                        schedules=[DeploymentScheduleCreate(schedule=every, active=True)])
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if [r for r in await c.read_flow_runs() if r.deployment_id == dep]:
                return print("scheduled")
            await asyncio.sleep(1)
        print("no run scheduled")
asyncio.run(main())
"""


def test_the_servers_scheduler_creates_the_runs_of_a_schedule(tmp_path):
    """Prefect 3.8's scheduler inserts runs through hybrid properties that SQLAlchemy 2.1 refuses to
    bulk-insert ("Can't evaluate bulk DML statement"): every loop failed, and the */30 evaluation never
    ran (an operator drill under `make ui`). pyproject.toml keeps SQLAlchemy below 2.1."""
    with prefect_server(tmp_path / "home", PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2") as env:
        out = subprocess.run([sys.executable, "-c", SCHEDULE_CHECK], env=env, capture_output=True, text=True,
                             timeout=300)
    log = (tmp_path / "home/server.log").read_text()
    assert out.stdout.strip() == "scheduled", out.stdout + out.stderr + log[-3000:]
    assert "bulk DML" not in log
