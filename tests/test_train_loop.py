"""Training runs under torchrun (issue #13, trainer side): checkpoints are exact and layout-independent,
a kill -9 mid-run resumes to the same losses bit for bit, and bad inputs stop with one line."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.core.errors import ConfigError
from tests.conftest import REPO
from tasks.core import lifeline
from trainer import checkpoint
from trainer.config import ModelParams, OptimParams, ParallelParams, ScheduleParams, TrainParams
from trainer.run import RunSpec, launch_and_kill, losses
from trainer.run import launch as launch_run

MODEL = ModelParams(n_layer=4, n_head=4, d_model=32, vocab_size=1024, seq_len=16, fused_kernels=False)
STEPS, BATCH = 8, 8


def spec(out: Path, tp=1, pp=2, dp=1, steps=STEPS, **train) -> RunSpec:
    t = TrainParams(model=MODEL, parallel=ParallelParams(tp=tp, pp=pp, dp=dp, micro_batch=2, global_batch=BATCH),
                    optim=OptimParams(lr=3e-3, grad_clip=0.5),
                    schedule=ScheduleParams(train_tokens=steps * BATCH * MODEL.seq_len,
                                            warmup_tokens=2 * BATCH * MODEL.seq_len),
                    checkpoint_every=2, keep_checkpoints=3, seed=3)
    return RunSpec(train=t.model_copy(update=train), out=str(out), mock_samples=1000)


def train(s: RunSpec) -> dict[int, float]:
    return launch_run(s, timeout=900)


def resume_from(src: Path, step: int, s: RunSpec) -> dict[int, float]:
    return train(s.model_copy(update={"init_from": str(src / "checkpoints" / f"step-{step:08d}")}))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """8 steps at (tp, pp, dp) = (2, 2, 1), a checkpoint every 2."""
    out = tmp_path_factory.mktemp("uninterrupted")
    got = train(spec(out, tp=2, pp=2))
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == \
        ["step-00000004", "step-00000006", "step-00000008"]  # keep_checkpoints = 3
    return out


def test_resume_at_the_same_layout_is_exact(uninterrupted, tmp_path):
    got = resume_from(uninterrupted, 4, spec(tmp_path, tp=2, pp=2))
    assert got == {k: v for k, v in losses(uninterrupted).items() if k > 4}


def test_resume_with_dropout_under_tensor_parallelism_is_exact(tmp_path):
    """Both dropout streams (trainer/rng.py) are in the checkpoint: the tensor-parallel one drawn by the
    attention of each rank's heads too, so the resumed steps draw the masks the uninterrupted ones did."""
    dropout = {"model": MODEL.model_copy(update={"dropout": 0.1})}
    whole = train(spec(tmp_path / "whole", tp=2, pp=1, steps=6, **dropout))
    got = resume_from(tmp_path / "whole", 4, spec(tmp_path / "resumed", tp=2, pp=1, steps=6, **dropout))
    assert got == {k: v for k, v in whole.items() if k > 4}


@pytest.mark.parametrize("tp,pp,dp", [(1, 2, 2), (2, 1, 1)])
def test_resume_at_another_layout(uninterrupted, tmp_path, tp, pp, dp):
    got, want = resume_from(uninterrupted, 4, spec(tmp_path, tp=tp, pp=pp, dp=dp)), losses(uninterrupted)
    assert sorted(got) == list(range(5, STEPS + 1))
    for step in range(5, STEPS + 1):
        assert abs(got[step] - want[step]) <= 1e-4 * abs(want[step]), step


def test_kill_9_mid_run_then_resume_gives_the_same_losses(tmp_path):
    # a checkpoint every 4 steps: the kill after step 5 lands past step 4's, so steps are redone
    reference = train(spec(tmp_path / "reference", steps=24, checkpoint_every=4))
    s = spec(tmp_path / "killed", steps=24, checkpoint_every=4)
    assert launch_and_kill(s, after_step=5) == 5, "killed after step 5, before step 6"
    assert checkpoint.latest(Path(s.out) / "checkpoints") is not None
    assert train(s) == reference


def test_ranks_stop_when_the_process_that_launched_them_is_killed(tmp_path):
    # the train stage killed by kill -9 (or its Prefect run cancelled) while torchrun and the ranks, each
    # in a session of its own, live on: the ranks trained to the end, into the folder a rerun writes
    s = spec(tmp_path / "run", steps=2000).model_copy(update={"mock_samples": 2000 * BATCH})  # minutes of steps
    Path(s.out).mkdir()
    (Path(s.out) / "spec.json").write_text(s.model_dump_json())
    code = ("import sys; from pathlib import Path; from trainer.run import RunSpec, launch; "
            "launch(RunSpec.model_validate_json(Path(sys.argv[1]).read_text()))")
    stage = subprocess.Popen([sys.executable, "-c", code, str(Path(s.out) / "spec.json")], cwd=REPO)
    metrics = Path(s.out) / "metrics.csv"
    deadline = time.monotonic() + 600
    while not (metrics.is_file() and metrics.read_text().count("\n") > 2):
        assert stage.poll() is None and time.monotonic() < deadline, "the run ended (or hung) before the kill"
        time.sleep(0.05)
    stage.kill()  # only the launching process, as `kill -9 <pid>` of the stage
    stage.wait()
    lifeline.wait_for_ranks(Path(s.out), timeout_s=120)  # the ranks let go of the run folder ...
    deadline = time.monotonic() + 120
    while launched(s.out) and time.monotonic() < deadline:  # ... and torchrun ends after them
        time.sleep(0.2)
    assert not launched(s.out)
    rows = metrics.read_text().count("\n")
    assert not (Path(s.out) / "result.json").exists() and rows < 2001, "the ranks trained on after the kill"
    assert "the launch that started this rank is gone" in (Path(s.out) / "launch.log").read_text()


def launched(out: str) -> list[str]:
    """The live processes whose command line names the run's run.json (torchrun and its ranks)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(Path(out) / "run.json").encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            pass
    return found


def test_a_checkpoint_of_another_model_is_refused(uninterrupted, tmp_path):
    s = spec(tmp_path, tp=2, pp=2)
    s = s.model_copy(update={"train": s.train.model_copy(update={"model": MODEL.model_copy(update={"d_model": 64})})})
    with pytest.raises(RuntimeError, match=r"configuration error: checkpoint .*step-00000004 is of another "
                                           r"model: d_model 32 != 64"):
        resume_from(uninterrupted, 4, s)


def test_a_checkpoint_is_not_another_model_for_its_initial_spread_or_how_it_is_computed(tmp_path):
    """init_std written out at its default was 'another model' (Megatron's check_checkpoint_args does not compare
    it: it acts before the first step only)."""
    from trainer.checkpoint import check_model
    saved = {"model": MODEL.model_dump()}
    check_model(saved, MODEL.model_copy(update={"init_std": 0.02, "fused_kernels": False, "attention": "softmax"}),
                tmp_path)
    with pytest.raises(ConfigError, match="is of another model: n_layer 4 != 3"):
        check_model(saved, MODEL.model_copy(update={"n_layer": 3}), tmp_path)


def test_a_diverging_loss_stops_with_the_step(tmp_path):
    with pytest.raises(RuntimeError, match=r"training failed: loss is (nan|inf) at step \d+"):
        train(spec(tmp_path, optim=OptimParams(lr=1e30, grad_clip=0.0)))


def test_too_few_samples_for_the_tokens_is_refused(tmp_path):
    s = spec(tmp_path).model_copy(update={"mock_samples": 20})
    with pytest.raises(RuntimeError, match="the data has 20 samples but step 3 needs samples up to 24"):
        train(s)


def test_export_to_hugging_face_gives_the_same_logits(uninterrupted, tmp_path):
    import torch
    from transformers import GPT2LMHeadModel

    from trainer.checkpoint import Tensors
    from trainer.export import export
    from trainer.model import GPT
    folder = checkpoint.latest(uninterrupted / "checkpoints")
    from tasks.tokenize import tokenizer as tokenizers
    tokenizer = tmp_path / "tokenizer.json"
    tokenizers.train(iter([["a few words to learn a byte-level tokenizer from"]]), 300).save(str(tokenizer))
    (tmp_path / "not-a-tokenizer.json").write_text("{}")
    with pytest.raises(Exception):
        export(folder, tmp_path / "hf", tmp_path / "not-a-tokenizer.json")
    assert not any((tmp_path / "hf").glob("*")) and not list(tmp_path.glob(".tmp-*"))  # nothing half-written
    out = export(folder, tmp_path / "hf", tokenizer)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                      "tokenizer.json", "tokenizer_config.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # as any file written here
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == tokenizers.eod_id(tokenizers.load(tokenizer))
    ours = GPT(ModelParams(**checkpoint.read_meta(folder)["model"]))
    tensors = Tensors(folder)
    ours.load_state_dict({k: tensors[f"param/{k}"] for k in ours.state_dict()})
    theirs = GPT2LMHeadModel.from_pretrained(out).eval()
    tokens = torch.randint(0, MODEL.vocab_size, (3, MODEL.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(tokens) - theirs(tokens).logits).abs().max() <= 1e-4


def test_batch_ramp_changes_micro_batches_and_resumes_mid_ramp(tmp_path):
    """Megatron's ramp (4 -> 8 by 2 over the first 24 samples) through DeepSpeed's micro-batch count;
    a resume in the middle of the ramp continues with the same batch sizes and losses."""
    ramp = {"rampup_start": 4, "rampup_increment": 2, "rampup_tokens": 24 * MODEL.seq_len,
            "train_tokens": 60 * MODEL.seq_len, "warmup_tokens": 0}
    s = spec(tmp_path / "ramp")
    s = s.model_copy(update={"train": s.train.model_copy(update={
        "schedule": s.train.schedule.model_copy(update=ramp), "keep_checkpoints": 10})})
    full = train(s)
    with (tmp_path / "ramp/metrics.csv").open(newline="") as f:
        batches = [int(r["global_batch"]) for r in csv.DictReader(f)]
    assert batches[:3] == [4, 4, 4] and batches[-1] == 8 and 6 in batches
    assert batches == sorted(batches) and sum(batches) >= 60
    mid = 4
    assert batches[mid] < 8, "step 5, the first after the resume point, is inside the ramp"
    resumed = resume_from(tmp_path / "ramp", mid, s.model_copy(update={"out": str(tmp_path / "resumed")}))
    assert resumed == {k: v for k, v in full.items() if k > mid}


def test_checkpoints_record_their_run_so_two_runs_step_n_are_told_apart(uninterrupted, tmp_path):
    """The scheduled evaluation keys a checkpoint by its name and meta.json: a run with another seed wrote
    a byte-identical meta.json, and its checkpoints were taken as evaluated, under the first run's scores."""
    from tasks.evaluate.history import checkpoint_key
    from trainer.loop import recipe_digest
    other = spec(tmp_path / "other", tp=2, pp=2, steps=4, seed=4)
    train(other)
    mine, theirs = uninterrupted / "checkpoints/step-00000004", tmp_path / "other/checkpoints/step-00000004"
    assert checkpoint.read_meta(theirs)["run"] == recipe_digest(other.train)
    assert checkpoint_key(mine) != checkpoint_key(theirs)
    # and a sample of its weights: the same run trained again from step 0 (after a fix) wrote a byte-identical
    # meta.json, and its checkpoints were taken as evaluated
    assert checkpoint.read_meta(mine)["weights_sample"] == checkpoint.weights_sample(mine)
    assert checkpoint.read_meta(mine)["weights_sample"] != checkpoint.read_meta(theirs)["weights_sample"]
    named = spec(tmp_path / "named", tp=2, pp=2, steps=2).model_copy(update={"run_id": "the train stage's identity"})
    train(named)  # the train stage passes its own identity (its blend and tokenizer too)
    assert checkpoint.read_meta(tmp_path / "named/checkpoints/step-00000002")["run"] == "the train stage's identity"


def test_a_damaged_checkpoint_is_named_and_removing_it_resumes_from_the_one_before(uninterrupted, tmp_path):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(uninterrupted / "checkpoints", run / "checkpoints")
    bad = run / "checkpoints/step-00000008/stage-1.safetensors"
    bad.write_bytes(bad.read_bytes()[:1000])  # a copy cut short
    with pytest.raises(Exception, match=f"input file error: checkpoint file {bad} cannot be read .*: the checkpoint "
                                        f"step-00000008 is damaged: remove {bad.parent} to resume from step-00000006"):
        train(spec(run, tp=2, pp=2))
    with pytest.raises(Exception) as given:  # a damaged checkpoint to start from: named, and no advice to remove it
        resume_from(run, 8, spec(tmp_path / "fresh", tp=2, pp=2))
    assert f"checkpoint file {bad} cannot be read" in str(given.value) and "remove" not in str(given.value)
    shutil.rmtree(bad.parent)  # what the message says to do: `latest` still names it
    got = train(spec(run, tp=2, pp=2))
    assert got == {k: v for k, v in losses(uninterrupted).items() if k > 6}  # resumed from step 6, exactly


def test_every_sample_once_resumed_at_another_batch_counts_whole_batches_of_what_is_left(tmp_path):
    """train_tokens 0 trains every sample once in whole batches. A finished run (28 of 30 samples at batch 4)
    resumed at batch 6 took whole batches of all 30 samples at 6 as its target, and step 8 then needed samples
    28-34: 'needs a larger blend'. From where it stands no whole batch of 6 is left, so it trains no step; a
    smaller batch trains what is left; and its checkpoints record one run throughout."""
    from trainer.loop import recipe_digest
    s = spec(tmp_path, pp=1, steps=0).model_copy(update={"mock_samples": 30})
    s = s.model_copy(update={"train": s.train.model_copy(update={
        "checkpoint_every": 100, "parallel": s.train.parallel.model_copy(update={"global_batch": 4})})})
    first = train(s)
    assert sorted(first) == list(range(1, 8))  # 7 batches of 4: 28 samples
    at = {b: s.model_copy(update={"train": s.train.model_copy(update={
        "parallel": s.train.parallel.model_copy(update={"global_batch": b})})}) for b in (6, 2)}
    assert train(at[6]) == first  # no step, no error
    assert [p.name for p in (tmp_path / "checkpoints").glob("step-*")] == ["step-00000007"]
    assert sorted(train(at[2])) == list(range(1, 9))  # one batch of the 2 samples left
    meta = checkpoint.read_meta(checkpoint.latest(tmp_path / "checkpoints"))
    assert (meta["consumed_samples"], meta["train_tokens"]) == (30, 30 * MODEL.seq_len)
    assert meta["run"] == checkpoint.read_meta(tmp_path / "checkpoints/step-00000007")["run"] == recipe_digest(s.train)


def test_the_weights_sample_tells_other_weights_apart_and_the_same_alike(tmp_path):
    import torch
    from safetensors.torch import save_file
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        (tmp_path / name).mkdir()
        torch.manual_seed(seed)
        save_file({"param/w": torch.randn(300, 300)}, str(tmp_path / name / "stage-0.safetensors"))
    sample = {name: checkpoint.weights_sample(tmp_path / name) for name in "abc"}
    assert sample["a"] == sample["b"] != sample["c"]
