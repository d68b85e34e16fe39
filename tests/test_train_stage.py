"""Stage train end to end on a small blend: a pp = 2 run through torchrun, its checkpoint, metrics,
Hugging Face export and suite; a rerun is a no-op; bad inputs fail with the rank's (or the layout's) line."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from tasks.core.config import parse_params
from tasks.core.errors import ConfigError, TrainingError, UnfinishedInput
from tasks.core.runner import run_stage
from tasks.validation import ExpectationFailed, validate_stage
from tests.test_tokenize_stage import run as tokenize

SAMPLE = {"model": {"n_layer": 2, "n_head": 2, "d_model": 32},
          "parallel": {"pp": 2, "micro_batch": 2, "global_batch": 4},
          "schedule": {"train_tokens": 0, "warmup_tokens": 64}}
RECIPE_KEYS = {"model", "parallel", "optim", "schedule", "seq_len"}


def params(tmp_path, profiles=None, **train):
    """The `sample` profile with the recipe keys given here replaced, plus any other profiles."""
    recipe = {**SAMPLE, **{k: v for k, v in train.items() if k in RECIPE_KEYS}}
    rest = {k: v for k, v in train.items() if k not in RECIPE_KEYS}
    section = {"profiles": {"sample": recipe, **(profiles or {})}, "checkpoint_every": 5, **rest}
    return parse_params({"paths": {"data_dir": str(tmp_path / "data")}, "train": section})


@pytest.fixture(scope="module")
def blended(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("blend")
    tokenize(tmp, train_tokens=640, blend=[{"dataset": "web", "weight": 2}, {"dataset": "books", "weight": 1}])
    return tmp


def test_train_stage_trains_checkpoints_exports_and_validates(blended, monkeypatch):
    p = params(blended)
    stats = run_stage("train", p)
    model = blended / "data/train/model"
    blend = json.loads((blended / "data/tokenize/blend/blend.json").read_text())
    assert stats["steps"] == blend["samples"] // 4 and stats["tokens"] == stats["steps"] * 4 * 16
    assert stats["layout"] == {"tp": 1, "pp": 2, "dp": 1} and stats["kernels"] == "reference (no GPU)"
    assert stats["model"]["seq_len"] == 16 and stats["model"]["vocab_size"] == 1024  # 300, padded
    assert stats["final_loss"] < stats["first_loss"] and "warnings" not in stats  # warmup 64 of 640+ tokens
    with (model / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, stats["steps"] + 1))
    assert {p.name for p in (model / "hf").iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                                          "tokenizer_config.json", "generation_config.json"}
    # sampling leaves out the rows that pad the vocabulary (300 ids, 1024 rows): ids the tokenizer has not
    generation = json.loads((model / "hf/generation_config.json").read_text())
    eos = json.loads((model / "hf/config.json").read_text())["eos_token_id"]
    assert generation["suppress_tokens"] == list(range(300, 1024)) and generation["eos_token_id"] == eos
    assert json.loads((model / "hf/tokenizer_config.json").read_text())["model_max_length"] == 16
    assert json.loads((model / "checkpoint/meta.json").read_text())["step"] == stats["steps"]
    # the weights are as readable as the rest (safetensors wrote them 0600: another user read meta.json only)
    umask = os.umask(0)
    os.umask(umask)
    assert {f.name: f.stat().st_mode & 0o777 for f in (model / "checkpoint").glob("*.safetensors")} == \
        {f.name: 0o666 & ~umask for f in (model / "checkpoint").glob("*.safetensors")} != {}
    # the run's folder keeps its tokenizer: the scheduled evaluation scores its checkpoints with it, moved aside too
    tokenizer = (blended / "data/tokenize/tokenizer/tokenizer.json").read_bytes()
    assert (blended / "data/train/work/tokenizer.json").read_bytes() == tokenizer
    assert stats["profile"] == "sample" and [r["profile"] for r in stats["profiles"]] == ["sample"]
    report = validate_stage("train", p)
    assert report.success
    # the suite loads the export and reads the steps logged (a truncated model.safetensors and a metrics.csv
    # missing its last steps passed a review's mutations: only the export's file names were checked)
    hf, log = model / "hf/model.safetensors", model / "metrics.csv"
    good_hf, good_log = hf.read_bytes(), log.read_bytes()
    hf.write_bytes(good_hf[:len(good_hf) // 2])
    log.write_bytes(b"".join(good_log.splitlines(keepends=True)[:-2]))
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("train", p)
    assert "'export_invalid'" in str(failed.value) and "'steps_not_logged_once'" in str(failed.value)
    hf.write_bytes(good_hf)
    log.write_bytes(good_log)
    assert validate_stage("train", p).success  # recorded in stats.json: the run below is up to date again
    from tasks.core import passes
    checked = []
    monkeypatch.setattr(passes, "global_output_change", lambda *a: checked.append(a))
    assert run_stage("train", p)["up_to_date"], "same blend and params: nothing retrained"
    assert checked == []  # nor the blend hashed whole against its markers: a run that reads nothing needs no check
    monkeypatch.undo()
    again = run_stage("train", p, skip_up_to_date=False)
    assert again["passes"][0]["resumed"] == 1, "same blend and params: nothing retrained"
    # a checkpoint changed at the same size (a disk error) is not evaluated: evaluate names the file
    shard = model / "checkpoint/stage-0.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(good[:-64] + bytes(64))
    with pytest.raises(UnfinishedInput, match=f"stage 'evaluate': {shard} changed since stage 'train' wrote it"):
        run_stage("evaluate", p)
    shard.write_bytes(good)
    # nor with a tokenizer edited since tokenize wrote it (train refuses it; evaluate scored other tokens)
    tokenizer = blended / "data/tokenize/tokenizer/tokenizer.json"
    text = tokenizer.read_text()
    tokenizer.write_text(text + "\n")
    with pytest.raises(UnfinishedInput, match=f"stage 'evaluate': {tokenizer} changed since stage 'tokenize' wrote it"):
        run_stage("evaluate", p)
    tokenizer.write_text(text)
    # the finished run with another global batch: the same run, resumed, no step to train; the report said
    # the new batch (and the tokens it would have made), which no step had trained at
    # (a batch whose whole batches cover fewer of the blend's samples than batch 4's did)
    wide = next(b for b in range(6, 64, 2) if blend["samples"] // b * b < blend["samples"] // 4 * 4)
    wider = params(blended, parallel={**SAMPLE["parallel"], "global_batch": wide})
    stats = run_stage("train", wider)
    assert stats["global_batch"] == 4 and stats["resumed_from_step"] == again["steps"] == stats["steps"]
    assert any(f"parallel.global_batch is {wide} but the run's last step trained at 4" in w for w in stats["warnings"])
    assert stats["train_tokens"] == stats["tokens"] == again["tokens"]  # the target it trained to
    assert validate_stage("train", wider).success  # failed: "tokens_off_schedule", against the new batch's
    # train_tokens pinned to the number 0 resolved to: the same run, resumed with no step to train (it started
    # another run from step 0 and moved this one to work.previous/)
    pinned = params(blended, schedule={**SAMPLE["schedule"], "train_tokens": again["train_tokens"]})
    stats = run_stage("train", pinned)
    assert stats["resumed_from_step"] == stats["steps"] == again["steps"] and stats["tokens"] == again["tokens"]
    assert not (blended / "data/train/work.previous").exists()


def test_a_layout_that_does_not_fit_fails_before_launching(blended):
    with pytest.raises(ConfigError, match="tp 3 does not divide n_head 2"):
        run_stage("train", params(blended, parallel={"tp": 3, "micro_batch": 2, "global_batch": 4}))


@pytest.mark.parametrize("change, message", [
    ({"parallel": {**SAMPLE["parallel"], "global_batch": 8}, "schedule": {**SAMPLE["schedule"], "rampup_start": 3,
      "rampup_increment": 2, "rampup_tokens": 256}}, r"schedule.rampup_start 3 is not a multiple of micro_batch x dp = 2"),
    ({"parallel": {**SAMPLE["parallel"], "global_batch": 8}, "schedule": {**SAMPLE["schedule"], "rampup_start": 2,
      "rampup_increment": 8, "rampup_tokens": 256}}, r"global_batch 8 - rampup_start 2 is not a multiple"),
    ({"parallel": {**SAMPLE["parallel"], "global_batch": 64}},
     r"profile 'sample': the blend has 40 samples of 16 tokens, fewer than one global batch \(64\)")])
def test_a_bad_ramp_or_a_batch_past_the_blend_is_refused_before_any_run_is_moved(blended, tmp_path, change, message):
    """A review: the ranks refused these after the stage had moved the run in work/ aside (deleting the one in
    work.previous): two typos in a row deleted both trained runs. A ramp that cannot reach its batch in whole
    increments divided by zero."""
    import shutil
    shutil.copytree(blended / "data" / "tokenize", tmp_path / "data" / "tokenize")
    work = _runs(tmp_path / "data" / "train", "an earlier run", "the one before")
    with pytest.raises(ConfigError, match=message):
        run_stage("train", params(tmp_path, **change))
    assert (work / "identity").read_text() == "an earlier run"
    assert (work.with_name("work.previous") / "identity").read_text() == "the one before"


def test_how_the_model_is_computed_is_not_another_run(blended):
    """A review: turning fused_kernels off (the stage's own advice when they cannot run) or another attention
    path made the stage take it for another run, which started from step 0 and moved the run aside."""
    from tasks.core.stage import Context
    from tasks.train.stage import check_run, run_identity
    ctx = Context("train", str(blended / "data"), "tokenize")
    identity = lambda **model: run_identity(check_run(params(blended, model={**SAMPLE["model"], **model}), ctx)[1], ctx)  # noqa: E731
    assert identity(fused_kernels=False) == identity(attention="softmax") == identity()
    assert identity(dropout=0.1) != identity(), "the recipe itself still is"


def test_a_rank_failure_fails_the_stage_with_the_ranks_line(blended):
    with pytest.raises(TrainingError, match=r"loss is (nan|inf) at step \d+ .*\(stage 'train', log: "):
        run_stage("train", params(blended, optim={"lr": 1.0e30, "grad_clip": 0.0}))


def test_train_needs_a_finished_blend(tmp_path):
    with pytest.raises(UnfinishedInput):
        run_stage("train", params(tmp_path))


BIG = {"model": {"n_layer": 105, "n_head": 128, "d_model": 20480},
       "parallel": {"tp": 8, "pp": 35, "dp": 8, "micro_batch": 1, "global_batch": 1920, "recompute": True}}


def test_every_profile_is_sized_and_a_too_big_one_is_refused_before_launching(blended):
    # a global batch the 40-sample blend holds (1920 is refused first, for the blend)
    p = params(blended, profiles={"big": {**BIG, "parallel": {**BIG["parallel"], "global_batch": 32}}}, profile="big")
    log = blended / "data/train/work/launch.log"
    before = log.stat().st_size if log.exists() else 0
    with pytest.raises(ConfigError, match=r"profile 'big' needs 2240 ranks of ~[\d.]+ GiB and this machine has "
                                          r"[\d.]+ GiB of memory: give train.launch.hostfile"):
        run_stage("train", p)
    assert (log.stat().st_size if log.exists() else 0) == before, "nothing was launched"


def test_a_bad_profile_is_named_even_when_another_runs(blended):
    bad = {**BIG, "parallel": {**BIG["parallel"], "tp": 3}}
    with pytest.raises(ConfigError, match="train.profiles.big: tp 3 does not divide n_head 128"):
        run_stage("train", params(blended, profiles={"big": bad}))


def test_more_train_tokens_than_the_blend_holds_are_refused_before_launching(blended):
    with pytest.raises(ConfigError, match=r"profile 'sample': train_tokens 100,000 need 6,252 samples of 16 tokens "
                                          r"and the blend has \d+: a larger blend"):
        run_stage("train", params(blended, schedule={"train_tokens": 100_000, "warmup_tokens": 64}))


def test_a_refused_run_leaves_the_last_completion_as_it_was(blended):
    stats = Path(blended) / "data/train/stats.json"
    kept = stats.read_bytes() if stats.exists() else None
    stats.parent.mkdir(parents=True, exist_ok=True)
    stats.write_text('{"stage": "train", "from": "the last run"}')
    try:
        with pytest.raises(ConfigError, match="profile 'sample' is for seq_len 2048"):
            run_stage("train", params(blended, seq_len=2048))
        assert stats.read_text() == '{"stage": "train", "from": "the last run"}'
    finally:
        stats.write_bytes(kept) if kept is not None else stats.unlink()


def test_a_profile_this_machine_cannot_train_is_refused_before_the_last_model_goes(blended):
    """fp16 on CPU was refused by the pass, after the runner had removed stats.json and the model's marker:
    the next stage refused to start, and the rerun after the fix relaunched the ranks to resume."""
    if os.environ.get("DS_ACCELERATOR", "cpu") != "cpu":
        pytest.skip("DeepSpeed trains fp16 here")
    planted = {Path(blended) / "data/train" / name: f'{{"from": "the last run", "file": "{name}"}}'
               for name in ("stats.json", "model.done.json")}
    kept = {path: path.read_bytes() if path.exists() else None for path in planted}
    try:
        for path, text in planted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        with pytest.raises(ConfigError, match="profile 'sample' trains in fp16, which DeepSpeed does not support on CPU"):
            run_stage("train", params(blended, optim={"dtype": "fp16"}))
        assert {path: path.read_text() for path in planted} == planted
    finally:
        for path, data in kept.items():
            path.write_bytes(data) if data is not None else path.unlink()


def test_a_model_done_for_these_parameters_is_reused_without_the_machine_check(blended, monkeypatch):
    """A model trained elsewhere (its outputs pulled) is reused by a stage that must run again (here: its
    stats.json gone) without this machine being able to train it."""
    from tasks.train import profiles
    p = params(blended)
    run_stage("train", p)  # trained by the first test, or here
    stats = Path(blended) / "data/train/stats.json"
    kept = stats.read_bytes()

    def cannot(*_):
        raise ConfigError("this machine cannot train it")
    monkeypatch.setattr(profiles, "check_launchable", cannot)
    try:
        stats.unlink()
        again = run_stage("train", p)
        assert [x["resumed"] for x in again["passes"]] == [1]
    finally:
        stats.write_bytes(kept)
    with pytest.raises(ConfigError, match="this machine cannot train it"):  # a model to train: checked
        run_stage("train", params(blended, schedule={"train_tokens": 0, "warmup_tokens": 32}))


def test_a_profile_for_another_context_length_is_refused(blended):
    with pytest.raises(ConfigError, match="profile 'sample' is for seq_len 2048 but the blend's samples hold 16"):
        run_stage("train", params(blended, seq_len=2048))


def test_an_unknown_profile_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigError, match="profile 'gpt-9000' is not one of profiles"):
        params(tmp_path, profile="gpt-9000")


def test_a_hostfile_with_other_slots_than_ranks_is_refused_before_launching(blended, tmp_path):
    (tmp_path / "hosts").write_text("node-a slots=8\nnode-b slots=8\n")
    with pytest.raises(ConfigError, match="has 16 slots on 2 host.s. but the layout has tp x pp x dp = 2 ranks"):
        # another warmup: a model to train (a model done for these parameters is reused without launching)
        run_stage("train", params(blended, launch={"hostfile": str(tmp_path / "hosts")},
                                  schedule={"train_tokens": 0, "warmup_tokens": 48}))


def test_a_gpu_machine_is_checked_for_devices_and_memory():
    from tasks.train.profiles import check_launchable
    p = params(Path("/nonexistent"), profiles={"big": BIG}, profile="big").train
    one_gpu = {"accelerator": "cuda", "devices": 1, "gib_per_device": 80.0}
    with pytest.raises(ConfigError, match="needs 2240 GPUs and this machine has 1"):
        check_launchable(p, {"gpus": 2240, "gib_per_gpu": 23.1}, one_gpu)
    with pytest.raises(ConfigError, match="needs ~90.0 GiB per GPU"):
        check_launchable(p, {"gpus": 1, "gib_per_gpu": 90.0}, one_gpu)
    check_launchable(p, {"gpus": 1, "gib_per_gpu": 18.7}, one_gpu)


def test_fp16_on_a_cpu_machine_is_refused_before_anything_moves(tmp_path):
    """DeepSpeed has no fp16 on CPU: the stage moved the finished run aside (deleting the older one), launched,
    and every rank failed with exit 1 after torchrun's traceback."""
    from tasks.train.profiles import check_launchable
    p = params(tmp_path, optim={"dtype": "fp16"}).train
    cpu = {"accelerator": "cpu", "devices": 0, "gib_total": 64.0}
    with pytest.raises(ConfigError, match="profile 'sample' trains in fp16, which DeepSpeed does not support on CPU"):
        check_launchable(p, {"gpus": 2, "gib_per_gpu": 0.1}, cpu)
    check_launchable(params(tmp_path, optim={"dtype": "bf16"}).train, {"gpus": 2, "gib_per_gpu": 0.1}, cpu)
    (tmp_path / "hosts").write_text("node-a slots=1\nnode-b slots=1\n")  # the hosts get this machine's accelerator
    on_hosts = params(tmp_path, optim={"dtype": "fp16"}, launch={"hostfile": str(tmp_path / "hosts")}).train
    with pytest.raises(ConfigError, match="profile 'sample' trains in fp16, which DeepSpeed does not support on CPU"):
        check_launchable(on_hosts, {"gpus": 2, "gib_per_gpu": 0.1}, cpu)
    check_launchable(on_hosts, {"gpus": 2, "gib_per_gpu": 0.1}, {"accelerator": "cuda", "devices": 0, "gib_per_device": 0})


@pytest.mark.parametrize("change,message", [
    ({"vocab_size": 256}, r"the data's vocabulary \(300 tokens\) does not fit the model's vocab_size 256"),
    ({"seq_len": 32}, "the data's samples hold 16 tokens but the model's seq_len is 32"),
])
def test_a_blend_that_does_not_fit_the_model_stops_every_rank_with_one_line(blended, tmp_path, change, message):
    """trainer.run on a finished blend with a model of another vocabulary or context length (a RunSpec
    written by hand, or a checkpoint's model reused): refused before any step, exit 2, every rank."""
    from trainer.config import ModelParams, ParallelParams, ScheduleParams, TrainParams
    from trainer.launch import LaunchFailed
    from trainer.run import RunSpec, launch
    model = ModelParams(n_layer=2, n_head=2, d_model=32, vocab_size=1024, seq_len=16).model_copy(update=change)
    train = TrainParams(model=model, parallel=ParallelParams(pp=2, micro_batch=2, global_batch=4),
                        schedule=ScheduleParams(train_tokens=64))
    data = blended / "data/tokenize"
    spec = RunSpec(train=train, out=str(tmp_path / "run"), blend_dir=str(data / "blend"),
                   datasets_dir=str(data / "datasets"))
    with pytest.raises(LaunchFailed, match=message) as failed:
        launch(spec, timeout=300)
    assert failed.value.line.startswith("configuration error: ")


def test_a_warmup_longer_than_the_run_is_a_warning(tmp_path):
    from tasks.train.stage import STAGE
    p = params(tmp_path, schedule={"train_tokens": 0, "warmup_tokens": 10_000})
    assert STAGE.warnings({"tokens": 2_500}, p) == [
        "train.profiles.sample.schedule.warmup_tokens (10,000) is more than the 2,500 tokens trained: the learning "
        "rate rose to 25.0% of its peak and never decayed"]
    assert STAGE.warnings({"tokens": 10_000}, p) == []


def test_fused_kernels_asked_for_but_unusable_on_a_gpu_are_a_warning(tmp_path, monkeypatch):
    """A cupy wheel for a newer CUDA than the driver's: cupy.is_available() is False and every kernel takes the
    torch path, with nothing said. Checkpoints record the path the model ran; the stage warns of it."""
    import torch
    from kernels import runtime
    from tasks.train.stage import STAGE
    from trainer.config import ModelParams
    from trainer.model import kernel_path
    monkeypatch.setattr(runtime, "why_unavailable", lambda: "CuPy finds no usable CUDA device")
    on = ModelParams(fused_kernels=True)
    assert kernel_path(on, torch.device("cuda", 0)) == "reference (CuPy finds no usable CUDA device)"
    assert kernel_path(on, torch.device("cpu")) == "reference (no GPU)"
    assert kernel_path(on.model_copy(update={"fused_kernels": False}), torch.device("cuda", 0)) == \
        "reference (fused_kernels off)"
    monkeypatch.setattr(runtime, "why_unavailable", lambda: None)
    assert kernel_path(on, torch.device("cuda", 0)) == "fused"
    p = params(tmp_path)
    assert STAGE.warnings({"kernels": "reference (CuPy finds no usable CUDA device)"}, p) == [
        "train.profiles.sample.model.fused_kernels is on but the run trained on the torch reference path: CuPy finds "
        "no usable CUDA device"]
    assert STAGE.warnings({"kernels": "reference (no GPU)"}, p) == STAGE.warnings({"kernels": "fused"}, p) == []


def test_going_back_to_the_previous_run_resumes_it_and_only_an_older_one_is_deleted(tmp_path, capsys):
    """Seed 1234 -> 99 -> 1234 deleted the finished 1234 run in work.previous and trained it again from step 1."""
    from tasks.train.work_folder import prepare as _work_folder

    work = tmp_path / "work"

    def run_with(identity: str, step: int) -> None:
        _work_folder(work, identity)
        (work / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (work / "checkpoints" / "latest").write_text(f"step-{step:08d}")

    run_with("A", 195)
    run_with("B", 40)
    assert (work / "identity").read_text() == "B" and (tmp_path / "work.previous" / "identity").read_text() == "A"
    assert "run (its latest checkpoint step-00000195) moved to" in capsys.readouterr().err
    _work_folder(work, "A")  # back to A: its checkpoints are resumed, B's kept
    assert (work / "identity").read_text() == "A" and (work / "checkpoints" / "step-00000195").is_dir()
    assert (tmp_path / "work.previous" / "identity").read_text() == "B"
    assert "moved back to" in capsys.readouterr().err
    _work_folder(work, "C")  # a third run: B, the older, is the one deleted, and the message says so
    assert (tmp_path / "work.previous" / "identity").read_text() == "A" and (work / "identity").read_text() == "C"
    err = capsys.readouterr().err
    assert f"deleted {tmp_path / 'work.previous'}, an earlier run (its latest checkpoint step-00000040)" in err
    assert not (tmp_path / "work.swap").exists()


def _runs(tmp_path: Path, work_id: str | None, previous_id: str | None) -> Path:
    work = tmp_path / "work"
    for folder, identity in ((work, work_id), (tmp_path / "work.previous", previous_id)):
        if identity is not None:
            (folder / "checkpoints" / "step-00000010").mkdir(parents=True)
            (folder / "identity").write_text(identity)
    return work


@pytest.mark.parametrize("killed_after", ["work moved aside", "previous moved back"])
def test_a_swap_of_two_runs_killed_half_way_loses_neither(tmp_path, killed_after):
    """A stage killed between the renames of a swap left one run only in work.swap/, which the next start
    deleted without a word."""
    from tasks.train.work_folder import prepare
    work = _runs(tmp_path, "B", "A")
    os.replace(work, tmp_path / "work.swap")  # the swap's first rename
    if killed_after == "previous moved back":
        os.replace(tmp_path / "work.previous", work)
    prepare(work, "A")
    assert (work / "identity").read_text() == "A" and (tmp_path / "work.previous" / "identity").read_text() == "B"
    assert not (tmp_path / "work.swap").exists()
    prepare(work, "B")  # and B is still there to go back to
    assert (work / "identity").read_text() == "B" and (work / "checkpoints" / "step-00000010").is_dir()


def test_a_work_folder_killed_before_its_identity_is_not_taken_for_a_run(tmp_path):
    """A start killed between making work/ and writing its identity left an empty work/; the next start
    with another run moved it over work.previous/, deleting the real run there."""
    from tasks.train.work_folder import prepare
    work = _runs(tmp_path, None, "A")
    work.mkdir()  # made, identity not yet written
    (work / "launch.log").write_text("")
    prepare(work, "B")
    assert (tmp_path / "work.previous" / "identity").read_text() == "A"
    assert (work / "identity").read_text() == "B" and not (work / "launch.log").exists()
    prepare(work, "A")
    assert (work / "checkpoints" / "step-00000010").is_dir()


def test_a_deletion_killed_half_way_is_never_taken_for_a_run(tmp_path):
    from tasks.train.work_folder import prepare
    work = _runs(tmp_path, "B", "A")
    (tmp_path / "work.deleting" / "checkpoints").mkdir(parents=True)  # an earlier run, half deleted
    prepare(work, "C")
    assert not (tmp_path / "work.deleting").exists()
    assert (tmp_path / "work.previous" / "identity").read_text() == "B" and (work / "identity").read_text() == "C"


def test_a_resumed_run_with_another_batch_is_sized_from_where_it_stands(blended, tmp_path):
    """With train_tokens given, the stage counted the samples a run needs from step 0 at params.yaml's batch:
    a finished run resumed at a larger batch was refused ('need 1,568 samples ... the blend has 1,562'),
    while a half-done one at another batch passed the check, trained, and failed at the step past the blend.
    Found by an operator drill."""
    import shutil
    shutil.copytree(blended / "data" / "tokenize", tmp_path / "data" / "tokenize")
    blend = json.loads((tmp_path / "data/tokenize/blend/blend.json").read_text())
    total = blend["samples"] // 4 * 4  # every whole batch of 4
    schedule = {**SAMPLE["schedule"], "train_tokens": total * 16}
    done = run_stage("train", params(tmp_path, schedule=schedule))
    assert done["tokens"] == total * 16
    # a larger batch whose whole batches, counted from step 0, would need more samples than the blend has
    wide = next(b for b in range(6, 64, 2) if -(-total // b) * b > blend["samples"])
    again = run_stage("train", params(tmp_path, schedule=schedule, parallel={**SAMPLE["parallel"], "global_batch": wide}))
    assert again["resumed_from_step"] == again["steps"] == done["steps"] and again["tokens"] == done["tokens"]
    # half-done (its last checkpoints gone): from step 5 at that batch the blend runs out, and that is said at once
    ckpts = tmp_path / "data/train/work/checkpoints"
    for later in sorted(ckpts.glob("step-*"))[1:]:
        shutil.rmtree(later)
    assert [p.name for p in ckpts.glob("step-*")] == ["step-00000005"], "keep_checkpoints kept step 5"
    # (another batch than `wide`: with the same params the stage is up to date, its outputs whole, and runs nothing)
    # the blend holds the budget's samples, so the run takes the whole batches left and leaves the partial last
    # one out, as Megatron does (it was refused, and before that failed at the step past the blend)
    short = next(b for b in range(wide + 2, 64, 2) if 20 + -(-(total - 20) // b) * b > blend["samples"])
    stats = run_stage("train", params(tmp_path, schedule=schedule, parallel={**SAMPLE["parallel"], "global_batch": short}))
    assert stats["resumed_from_step"] == 5 and stats["samples"] <= blend["samples"] < stats["samples"] + short
    assert stats["tokens"] == stats["train_tokens"] < total * 16
    assert any("would have run past its samples" in w for w in stats["warnings"])


def test_the_budget_the_blend_was_built_for_trains_its_whole_batches(blended, tmp_path):
    """tokenize and train at the same train_tokens: the blend holds train_tokens // seq_length samples, and a
    global batch that does not divide them made the last batch run past it, refused before launch, so MT-NLG's
    documented setting (270B both; 80,086 steps in Megatron) could not start (a review against
    Megatron-DeepSpeed). The partial last batch is left out, as Megatron leaves it."""
    import shutil
    shutil.copytree(blended / "data" / "tokenize", tmp_path / "data" / "tokenize")
    blend = json.loads((tmp_path / "data/tokenize/blend/blend.json").read_text())
    assert blend["train_tokens"] == 640 and blend["samples"] == 40
    p = params(tmp_path, schedule={**SAMPLE["schedule"], "train_tokens": 640},
               parallel={**SAMPLE["parallel"], "global_batch": 6})
    stats = run_stage("train", p)
    assert stats["steps"] == 6 and stats["tokens"] == stats["train_tokens"] == 36 * 16
    assert stats["warnings"] == ["train.profiles.sample.schedule.train_tokens is 640: the blend's last batch would have "
                                 "run past its samples, so the run trained its whole batches, 576 tokens (Megatron "
                                 "leaves a partial last batch out too)"]
    assert validate_stage("train", p).success


def test_the_resume_point_is_found_wherever_the_run_is_kept(tmp_path):
    """The stage sizes a resumed run from the checkpoint it will resume from: in work/, in work.previous/
    (moved back), or in a killed swap's work.swap/ (put back by the next start)."""
    from tasks.train.work_folder import resumes_from
    for place, step in (("work", 3), ("work.previous", 5), ("work.swap", 7)):
        (tmp_path / place / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        folder = tmp_path / place / "checkpoints" / f"step-{step:08d}"
        folder.joinpath("meta.json").write_text(json.dumps({"step": step, "model": {}, "layout": {"tp": 1, "pp": 1}}))
        folder.joinpath("stage-0.safetensors").touch()  # a checkpoint's files, as read_meta checks them
        (tmp_path / place / "checkpoints" / "latest").write_text(f"step-{step:08d}")
        (tmp_path / place / "identity").write_text(place)
    assert [resumes_from(tmp_path / "work", place)["step"] for place in ("work", "work.previous", "work.swap")] == [3, 5, 7]
    assert resumes_from(tmp_path / "work", "another run") is None


def test_a_run_stopped_before_its_first_checkpoint_never_costs_the_run_before(tmp_path, capsys):
    """A UI drill: a run cancelled as train began (an identity and a launch log, no checkpoint) was moved to
    work.previous/, deleting the checkpointed run there; the next run then kept the empty one instead."""
    from tasks.train.work_folder import prepare
    work = _runs(tmp_path, "A", None)  # A: params.yaml's run, with a checkpoint
    prepare(work, "B")  # a custom run, cancelled before its first checkpoint
    (work / "launch.log").write_text("cancelled")
    (work / "checkpoints" / "step-00000002.partial").mkdir(parents=True)  # its first save, cut short
    prepare(work, "C")  # the next custom run
    assert (tmp_path / "work.previous" / "identity").read_text() == "A", capsys.readouterr().err
    assert (tmp_path / "work.previous" / "checkpoints" / "step-00000010").is_dir()
    assert (work / "identity").read_text() == "C" and not (work / "launch.log").exists()


def test_the_work_folders_notices_reach_the_flow_runs_log_not_the_workers_terminal(tmp_path, capsys):
    """A UI drill: 'moved to work.previous', 'deleted ...' and 'resuming' were printed to stderr, which reached the
    worker's terminal only: the UI never said a run had been moved or deleted. The flows forward them to the
    run's log (flows.stages, notices.forwarded_to); a command prints them on stderr as before."""
    from tasks.core import notices
    from tasks.train.work_folder import prepare
    work = _runs(tmp_path, "A", None)
    said: list[str] = []
    with notices.forwarded_to(said.append):
        prepare(work, "B")
    assert capsys.readouterr().err == "" and len(said) == 1
    assert said[0].startswith("train: this run's parameters describe another run (model, recipe, seed or data "
                              "changed): the work folder's run (") and "moved to" in said[0]
    prepare(work, "A")
    assert "this run's parameters describe the run in" in capsys.readouterr().err
