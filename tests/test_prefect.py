"""Prefect against a real `prefect server start` on 127.0.0.1: pipeline runs, artifacts, a
deployment from prefect.yaml triggered as the UI does, and shards on an existing Dask cluster."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, free_port
from tests.project_copy import copy_project
from tests.test_dvc import dvc, ran



def api(env: dict, path: str, body: dict | None = None):
    """One call of the server's REST API. A 503 is tried again, as Prefect's own client does: the server
    answers it when its SQLite database was busy (a loaded CI machine), and nothing was written."""
    req = urllib.request.Request(env["PREFECT_API_URL"] + path, method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    deadline, wait = time.monotonic() + 120, 1  # Prefect's own client keeps trying for about a minute
    while True:
        try:
            return json.loads(urllib.request.urlopen(req, timeout=30).read())
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(wait)
            wait = min(2 * wait, 8)


def run_logs(env: dict, flow_run: dict) -> str:
    """A flow run's state message and the last log lines of it and its stages' runs: what a failed run's
    assertion shows (the cause is logged in the stage's own run)."""
    ids = [flow_run["id"]] + [r["id"] for r in api(env, "/flow_runs/filter", {
        "flow_runs": {"parent_flow_run_id": {"any_": [flow_run["id"]]}}})]
    logs = api(env, "/logs/filter", {"logs": {"flow_run_id": {"any_": ids}}, "sort": "TIMESTAMP_ASC"})
    lines = [f"{entry['level']} {entry['message']}" for entry in logs][-60:]
    return "\n".join([f"state: {flow_run['state_type']}: {(flow_run.get('state') or {}).get('message')}", *lines])


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def runs_since(env: dict, since: str) -> list[dict]:
    """The flow runs that started after `since` (now()): a test's own. The server is the session's, and
    other test files that xdist puts in the same worker leave their runs on it (the stop drills' Crashed
    and Cancelled pipeline runs); a plain filter also stops at 200 runs, in id order, not time order."""
    return api(env, "/flow_runs/filter", {"flow_runs": {"start_time": {"after_": since}}})


def run(cmd: list[str], cwd: Path, env: dict, timeout: int = 600) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout + out.stderr


def test_pipeline_against_server_publishes_artifacts_and_leaves_dvc_up_to_date(server, tmp_path):
    since = now()
    repo = copy_project(tmp_path)
    out = run([sys.executable, "-m", "flows.pipeline", "params.yaml"], repo, server)
    # the run recorded every stage in dvc.lock: DVC finds nothing to redo
    assert "recorded in dvc.lock: sample, download, extract, filter, dedup, decontaminate, tokenize, train, evaluate" in out
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    assert ran(dvc(repo, "repro")) == []
    runs = runs_since(server, since)
    by_name = {}
    for r in runs:
        flow = api(server, f"/flows/{r['flow_id']}")["name"]
        by_name.setdefault(flow, []).append(r["state_type"])
    assert by_name["pretraining-pipeline"] == ["COMPLETED"]
    assert {"stage-sample", "stage-download", "stage-extract", "stage-filter", "stage-dedup",
            "stage-decontaminate"} <= set(by_name)
    arts = api(server, "/artifacts/filter", {"artifacts": {
        "key": {"any_": ["download-stats", "extract-stats", "decontaminate-stats"]},
        "flow_run_id": {"any_": [r["id"] for r in runs]}}})
    text = {a["key"]: a["data"] for a in arts}
    assert "| docs out |" in text["extract-stats"] and "### Validation passed" in text["extract-stats"]
    assert "Data Docs" in text["download-stats"]
    assert "| lambada |" in text["decontaminate-stats"] and "Task n-gram index" in text["decontaminate-stats"]
    # the training run's progress in the UI: a progress artifact at 100% and its step lines in the run's log
    train_run = next(r for r in runs if api(server, f"/flows/{r['flow_id']}")["name"] == "stage-train")
    progress = api(server, "/artifacts/filter", {"artifacts": {"type": {"any_": ["progress"]},
                                                               "flow_run_id": {"any_": [train_run["id"]]}}})
    assert [a["data"] for a in progress] == [100.0]
    logs = api(server, "/logs/filter", {"logs": {"flow_run_id": {"any_": [train_run["id"]]}}})
    steps = [entry["message"] for entry in logs if entry["message"].startswith("train step ")]
    assert steps and re.match(r"train step 2: loss \d+\.\d{4}, lr .*, 2,048/2,048 tokens \(100%\)", steps[-1]), steps
    # a second run finds every stage up to date: nothing runs or changes, and the UI says so
    stats = {f: f.read_bytes() for f in sorted((repo / "data").glob("*/stats.json"))}
    (repo / "dvc.lock").write_bytes(b"")  # emptied by a dvc killed as it wrote it (an operator drill)
    out = run([sys.executable, "-m", "flows.pipeline", "params.yaml"], repo, server)
    assert out.count("up to date (its code, parameters and inputs are those of the run that made its outputs") == 9
    assert {f: f.read_bytes() for f in sorted((repo / "data").glob("*/stats.json"))} == stats
    # the damaged dvc.lock failed every later run ("dvc commit failed: required key not provided"): set aside
    assert f"{repo / 'dvc.lock'} was damaged (kept as dvc.lock.damaged); recorded in dvc.lock: sample, " in out
    assert (repo / "dvc.lock.damaged").read_bytes() == b""
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    runs = runs_since(server, since)
    texts = [a["data"] for a in api(server, "/artifacts/filter", {"artifacts": {
        "key": {"any_": ["filter-stats"]}, "flow_run_id": {"any_": [r["id"] for r in runs]}}})]
    assert len(texts) == 2 and sum("**Up to date:** not run again" in t for t in texts) == 1
    assert all("### Validation passed" in t for t in texts)
    trains = [r["id"] for r in runs if api(server, f"/flows/{r['flow_id']}")["name"] == "stage-train"]
    progress = api(server, "/artifacts/filter", {"artifacts": {"type": {"any_": ["progress"]}, "flow_run_id": {"any_": trains}}})
    assert len(trains) == 2 and [a["data"] for a in progress] == [100.0]  # none for the run that did not train
    # a run from another parameter file is an experiment: dvc.lock keeps describing params.yaml's outputs
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    raw["sample"]["seed"] = 99
    (repo / "experiment.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    out = run([sys.executable, "-m", "flows.pipeline", "experiment.yaml", "sample"], repo, server)
    assert "parameters differ from params.yaml: run not recorded in dvc.lock" in out
    assert "modified:" in dvc(repo, "status", "sample")  # the data is no longer what dvc.lock says


def test_deployment_triggered_like_the_ui(server, tmp_path):
    repo = copy_project(tmp_path)
    prefect = str(BIN / "prefect")
    run([prefect, "work-pool", "create", "local-process", "--type", "process", "--overwrite"], repo, server)
    run([prefect, "--no-prompt", "deploy", "--all"], repo, {**server, "PWD": str(repo)})
    # a custom run of the first three stages (the whole DAG through Prefect is the test above's), whose form sent
    # the sample section only: the form leaves out a field that was emptied, which then took the model's default,
    # not the params.yaml value the form showed (a review: 4 WARC files for 2, every evaluation doc for 3)
    sample = yaml.safe_load((repo / "params.yaml").read_text())["sample"]
    out = run([prefect, "deployment", "run", "pretraining-pipeline/sample", "--param",
               'stages=["sample", "download", "extract"]', "--param", f"params={json.dumps({'sample': sample})}"],
              repo, server)
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
    worker = run([prefect, "worker", "start", "--pool", "local-process", "--run-once"], repo, server)
    flow_run = api(server, f"/flow_runs/{run_id}")
    assert flow_run["state_type"] == "COMPLETED", run_logs(server, flow_run) + "\nworker:\n" + worker[-3000:]
    logs = run_logs(server, flow_run)
    assert "recorded in dvc.lock: sample, download, extract" in logs  # the run was params.yaml's
    assert re.search(r"params: \d+ field\(s\) left empty take params.yaml's value: paths, runner, download, ", logs), logs
    assert (repo / "data/extract/stats.json").is_file() and not (repo / "data/filter").exists()


def test_shards_on_an_existing_dask_cluster(server, tmp_path):
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Finished(SchedulerPlugin):
        keys: list[str] = []

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "memory":
                self.keys.append(str(key))

    repo = copy_project(tmp_path)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      host="127.0.0.1") as cluster:
        cluster.scheduler.add_plugin(Finished())
        raw = yaml.safe_load((repo / "params.yaml").read_text())
        raw["runner"] = {"kind": "dask", "max_workers": 2, "dask_address": cluster.scheduler_address}
        raw["paths"]["data_dir"] = str(repo / "data")
        (repo / "params.yaml").write_text(yaml.safe_dump(raw))
        # the sharded stages (train and evaluate run no shards)
        run([sys.executable, "-m", "flows.pipeline", "params.yaml", "sample", "download", "extract", "filter", "dedup",
             "decontaminate", "tokenize"], repo, server)
        shard_keys = [k for k in Finished.keys if "shard" in k]
        # 2 WARC + 2 curated shards through download, extract, filter's rules, score, aside and keep,
        # dedup's signatures, aside and remove, the n-gram count pass, removal and tokens; dedup's 20 LSH bands
        assert len(shard_keys) == 4 * 12 + 20, shard_keys
    stats = json.loads((repo / "data/extract/stats.json").read_text())
    assert stats["shards"] == 4 and stats["docs_out"] > 0
    # the dedup stage run locally (sequentially) on the same input gives the same bytes as on the cluster
    from tasks.core.config import load_params
    from tasks.core.runner import run_stage

    local = tmp_path / "local"
    shutil.copytree(repo / "data/extract", local / "extract")
    shutil.copytree(repo / "data/filter", local / "filter")
    p = load_params(str(repo / "params.yaml"))
    p = p.model_copy(update={"paths": p.paths.model_copy(update={"data_dir": str(local)})})
    assert run_stage("dedup", p)["docs_out"] == json.loads((repo / "data/dedup/stats.json").read_text())["docs_out"]
    for rel in ["components/removed.npz", *[str(f.relative_to(repo / "data/dedup")) for f in
                                            (repo / "data/dedup").glob("**/shards/*")]]:
        assert (local / "dedup" / rel).read_bytes() == (repo / "data/dedup" / rel).read_bytes(), rel


def test_a_failing_stage_fails_the_run_with_the_cli_line(server, tmp_path):
    import shutil

    from tests.conftest import BENCHMARKS
    from tests.test_curated import a_failed_validation_planted

    repo = copy_project(tmp_path / "repo")
    bench = tmp_path / "bench"
    shutil.copytree(BENCHMARKS, bench)
    (bench / "boolq/dev.jsonl").write_text('{"question": "q", "passage": "p", "answer": true}\n{"question"\n')
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    raw["paths"]["benchmarks_dir"] = str(bench)
    (repo / "params.yaml").write_text(yaml.safe_dump(raw))
    # a previous run's stats: the failed stage's row showed them as this run's, "passed"
    (repo / "data/sample").mkdir(parents=True)
    (repo / "data/sample/stats.json").write_text(json.dumps({"stage": "sample", "docs_out": 777, "wall_seconds": 9.5}))
    since = now()
    out = subprocess.run([sys.executable, "-m", "flows.pipeline", "params.yaml"], cwd=repo, env=server,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 2, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("input file error: task 'boolq': line 2: not valid JSON"), line
    failed = {}
    for r in runs_since(server, since):
        if r["state_type"] != "COMPLETED":
            failed.setdefault(api(server, f"/flows/{r['flow_id']}")["name"], []).append(r["state"]["message"])
    assert failed == {"pretraining-pipeline": [line], "stage-sample": [line]}  # the sample plants task passages
    row = summary_row(server, since, "sample")
    assert "777" not in row and "9.5" not in row and "artifact" not in row and "input file error" in row, row

    # a failed validation: its row links the report the stage published (it was not linked)
    (bench / "boolq/dev.jsonl").write_text((BENCHMARKS / "boolq/dev.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    since = now()
    failing = a_failed_validation_planted("flows.stages", "from flows.pipeline import main; "
                                                          "sys.exit(main(['params.yaml', 'sample']))")
    out = subprocess.run([sys.executable, "-c", failing], cwd=repo, env=server, capture_output=True, text=True, timeout=600)
    assert out.returncode == 3, out.stderr[-3000:]
    row = summary_row(server, since, "sample")
    assert "[artifact](" in row and "a planted failure" in row, row


def summary_row(env: dict, since: str, stage: str) -> str:
    """The stage's row in the pipeline-summary artifact of the pipeline run that started after `since`."""
    run = next(r for r in runs_since(env, since) if api(env, f"/flows/{r['flow_id']}")["name"] == "pretraining-pipeline")
    arts = api(env, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
    summary = next(a for a in arts if a["key"] == "pipeline-summary")
    return next(x for x in summary["data"].splitlines() if x.startswith(f"| {stage} |"))


def _chromium():
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    api = pytest.importorskip("playwright.sync_api")
    return api.sync_playwright, api.expect


def test_ui_quick_run_shows_summary_plots_and_data_docs(server, tmp_path):
    """As a person would: deploy, open the UI (its default, V2: Prefect 3.8 serves V1 at the root's old
    pages and V2 under /v2), press Run -> Quick run, let a worker run it, then find the summary artifact on
    the run, follow its link to a stage's artifact in the same UI, a plot that renders and a Data Docs
    link that opens; the V1 page of that artifact renders too."""
    sync_playwright, expect = _chromium()
    docs_port = free_port()
    repo = copy_project(tmp_path, paths={"docs_url": f"http://127.0.0.1:{docs_port}"})
    # the quick run of this copy's deployment runs the stages the checks below read (the whole DAG through Prefect
    # is test_pipeline_against_server's): about a minute of the suite; the real deployment has no parameters
    stages = ["sample", "download", "extract"]
    deployments = yaml.safe_load((repo / "prefect.yaml").read_text())
    sample = next(d for d in deployments["deployments"] if d["name"] == "sample")
    assert sample["parameters"] == {}, "a quick run of the real deployment reads params.yaml whole"
    sample["parameters"] = {"stages": stages}
    (repo / "prefect.yaml").write_text(yaml.safe_dump(deployments, sort_keys=False))
    docs = subprocess.Popen([sys.executable, "-m", "flows.docs_server", "--params", "params.yaml"], cwd=repo,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    prefect, ui = str(BIN / "prefect"), server["PREFECT_UI_URL"]
    try:
        run([prefect, "work-pool", "create", "local-process", "--type", "process", "--overwrite"], repo, server)
        run([prefect, "deploy", "--all"], repo, {**server, "PREFECT_CLI_PROMPT": "false", "PWD": str(repo)})
        dep = api(server, "/deployments/filter", {"deployments": {"name": {"any_": ["sample"]}}})[0]
        assert dep["schedules"] == [] and dep["parameters"] == {"stages": stages}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # the UI renders after its own API calls: each check waits for what it looks for (never a fixed
            # sleep, which a loaded machine outlasts), up to a minute (expect() has its own 5 s default)
            page.set_default_timeout(60_000)
            page.goto(ui)  # the address a person opens: the server sends a new browser to its default UI
            page.wait_for_url(f"{ui}/v2/**")
            v2 = f"{ui}/v2"
            page.goto(f"{v2}/deployments/deployment/{dep['id']}/run")  # the custom-run form
            expect(page.get_by_text("N Warc Files").first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("Every pipeline parameter").first).to_be_visible(timeout=60_000)
            page.wait_for_function("url => [...document.querySelectorAll('textarea, input')]"
                                   ".some(e => e.value === url)", arg=f"http://127.0.0.1:{docs_port}")
            page.goto(f"{v2}/deployments/deployment/{dep['id']}")
            # another test in this session may already have run the same deployment: count new runs only
            before = {r["id"] for r in api(server, "/flow_runs/filter",
                                           {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})}
            page.get_by_role("button", name="Run", exact=True).click()  # top right, beside the menu
            page.get_by_text("Quick run").first.click()
            deadline, runs = time.monotonic() + 60, []
            while not runs and time.monotonic() < deadline:  # the UI's POST is not awaited by the click
                runs = [r for r in api(server, "/flow_runs/filter", {"flow_runs": {"deployment_id": {
                    "any_": [dep["id"]]}}}) if r["id"] not in before]
                time.sleep(0.2)
            assert len(runs) == 1, "the Quick run button must create one flow run"
            run([prefect, "worker", "start", "--pool", "local-process", "--run-once"], repo, server)
            flow_run = api(server, f"/flow_runs/{runs[0]['id']}")
            assert flow_run["state_type"] == "COMPLETED", flow_run["state"]
            arts = api(server, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}}})
            summary = next(a for a in arts if a["key"] == "pipeline-summary")
            assert "| extract |" in summary["data"] and "/artifacts/artifact/" in summary["data"]

            page.goto(f"{v2}/artifacts/artifact/{summary['id']}")
            link = page.locator("tr", has_text="extract").get_by_role("link", name="artifact")
            assert link.get_attribute("href").startswith(f"{v2}/artifacts/artifact/")  # stays in this UI
            link.click()  # the extract stage's artifact
            expect(page.get_by_text("expect_column_values_to_be_unique").first).to_be_visible(timeout=60_000)
            assert page.url.startswith(f"{v2}/artifacts/artifact/") and "Stage" in page.content()
            v2_page = page.url.split("?")[0]
            for url in (v2_page, v2_page.replace(f"{v2}/", f"{ui}/", 1)):  # and the V1 UI's page of it
                page.goto(url)
                expect(page.get_by_text("expect_column_values_to_be_unique").first).to_be_visible(timeout=60_000)
                page.wait_for_function("() => [...document.images].some(e => e.src.startsWith('data:image/png')) && "
                                       "[...document.images].every(e => e.complete)")  # decoded, or failed to
                widths = page.eval_on_selector_all("img", "els => els.filter(e => e.src.startsWith('data:image/png'))"
                                                          ".map(e => e.naturalWidth)")
                assert widths and all(w > 100 for w in widths), (url, widths)  # the plots rendered
                href = page.get_by_role("link", name="Data Docs").first.get_attribute("href")
                assert href == f"http://127.0.0.1:{docs_port}/extract/index.html", url  # the stage's own site
            page.screenshot(path=str(tmp_path / "extract-artifact-v1.png"))
            page.goto(href)
            assert "Data Docs" in page.title() or "expectation" in page.content().lower()
            page.goto(f"http://127.0.0.1:{docs_port}/index.html")  # the index lists every stage's site
            assert page.locator("a[href='extract/index.html']").count() == 1, page.content()[:2000]
            browser.close()
    finally:
        os.killpg(docs.pid, signal.SIGTERM)


def test_a_command_line_run_sends_no_telemetry(tmp_path):
    # `python -m flows.pipeline` run without make (whose exports turn it off) had the temporary server
    # try to reach Prefect's telemetry endpoint
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK")}
    code = "import flows.pipeline; from prefect.settings import get_current_settings as s; print(s().server.analytics_enabled)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
