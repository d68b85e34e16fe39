"""Checkpoint state beyond the tensors: DeepSpeed's fp16 loss scaler goes through meta.json and a
restored scaler makes the same decisions as the one that never stopped; a full disk during a save
leaves the previous checkpoint the one that loads, and the run resumes from it to the same losses."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler

from tests.test_train_loop import MODEL, spec
from trainer import checkpoint
from trainer.run import launch as launch_run
from trainer.run import losses
from trainer.size import parameters


def scaler() -> DynamicLossScaler:
    # DeepSpeed's fp16 defaults as trainer.engine configures them: 2^16, window 1000, hysteresis 2
    return DynamicLossScaler(init_scale=2.0**16, scale_window=1000, min_scale=1, delayed_shift=2,
                             consecutive_hysteresis=False)


def engine_with(s) -> SimpleNamespace:
    return SimpleNamespace(ds=SimpleNamespace(optimizer=SimpleNamespace(loss_scaler=s)))


def test_the_fp16_loss_scaler_resumes_where_it_was():
    before = scaler()
    for _ in range(1500):  # past one doubling (window 1000); then a pending hysteresis
        before.update_scale(False)
    before.cur_hysteresis, before.last_overflow_iter = 1, 1400
    state = json.loads(json.dumps(checkpoint.scaler_state(checkpoint.loss_scaler(engine_with(before)))))
    assert state["cur_scale"] == 2.0**17 and state["cur_iter"] == 1500
    after = scaler()
    checkpoint.restore_scaler(checkpoint.loss_scaler(engine_with(after)), state)
    for _ in range(1200):
        before.update_scale(False)
        after.update_scale(False)
        assert (after.cur_scale, after.cur_iter, after.cur_hysteresis) == \
            (before.cur_scale, before.cur_iter, before.cur_hysteresis)
    assert after.cur_scale == 2.0**18, "doubled again 1000 clean steps after the restored overflow"


def test_bf16_and_fp32_have_no_scaler_to_save():
    assert checkpoint.loss_scaler(engine_with(LossScaler(scale=1.0))) is None
    assert checkpoint.scaler_state(None) is None
    checkpoint.restore_scaler(None, {"cur_scale": 8.0})  # an fp16 checkpoint resumed in bf16: nothing to set


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
                           capture_output=True)
    return probe.returncode == 0


DISK_FULL = '''
import sys
from pathlib import Path
from trainer.run import RunSpec, launch
spec = RunSpec.model_validate_json(Path(sys.argv[1]).read_text())
try:
    launch(spec, timeout=600)
except RuntimeError as e:
    print("LAUNCH FAILED:", e.line if hasattr(e, "line") else e)
    sys.exit(0)
sys.exit("the run finished on a full disk")
'''


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare -rm to mount a small tmpfs")
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    """The run's checkpoints on a tmpfs with room for one checkpoint and a half: the save at step 4
    fits, the one at step 8 runs out of space mid-write. The writing rank must fail with a line that
    says so, `latest` must still name step 4, and a resume from it must give the same losses again."""
    # a checkpoint: fp32 weights and both Adam moments of every parameter, plus small RNG and meta files
    size = parameters(MODEL) * 3 * 4
    s = spec(tmp_path / "full", steps=10, checkpoint_every=4)
    (tmp_path / "full").mkdir()
    (tmp_path / "full/run.json").write_text(s.model_dump_json())
    (tmp_path / "drive.py").write_text(DISK_FULL)
    saved = tmp_path / "saved"
    ckpt = tmp_path / "full/checkpoints"
    ckpt.mkdir()
    # in a private mount namespace: the tmpfs vanishes with it, so its contents are copied out at the end
    script = (f"mount -t tmpfs -o size={int(size * 1.5)} tmpfs {ckpt} && "
              f"{sys.executable} {tmp_path / 'drive.py'} {tmp_path / 'full/run.json'}; rc=$?; "
              f"cp -a {ckpt} {saved}; df -k {ckpt} | tail -1; exit $rc")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    failed = next(ln for ln in done.stdout.splitlines() if ln.startswith("LAUNCH FAILED:"))
    assert "No space left on device" in failed and "step 8" in failed, failed
    assert (saved / "latest").read_text() == "step-00000004"
    assert not (saved / "step-00000008").exists()
    full = losses(tmp_path / "full")
    assert sorted(full) == list(range(1, 9)), "steps 1-8 ran; the save after step 8 failed"
    # resume from what the full disk left: the same losses as the run that had the disk
    resumed = launch_run(spec(tmp_path / "resumed", steps=10, checkpoint_every=4).model_copy(
        update={"init_from": str(saved / "step-00000004")}), timeout=900)
    assert sorted(resumed) == [5, 6, 7, 8, 9, 10]
    assert {k: resumed[k] for k in range(5, 9)} == {k: full[k] for k in range(5, 9)}


def test_prune_takes_a_checkpoint_away_at_once(tmp_path, monkeypatch):
    """A checkpoint deleted file by file stood half-deleted under its own name, which a reader (the scheduled
    evaluation) took for a damaged checkpoint: it is renamed out of sight first, then deleted."""
    from trainer import checkpoint
    for step in (2, 4, 6, 8):
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}" / "meta.json").write_text("{}")
    (tmp_path / "latest").write_text("step-00000008")
    (tmp_path / ".pruned-step-00000001").mkdir()  # left by a prune killed while deleting
    deleted = []
    real = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        deleted.append((Path(path).name, sorted(p.name for p in tmp_path.glob("step-*"))))
        return real(path, *args, **kwargs)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    checkpoint.prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000006", "step-00000008"]
    assert [name for name, _ in deleted] == [".pruned-step-00000001", ".pruned-step-00000002", ".pruned-step-00000004"]
    assert "step-00000002" not in deleted[1][1] and "step-00000004" not in deleted[2][1]  # gone before deleted


def test_export_of_what_is_not_a_checkpoint_is_one_line(tmp_path, capsys):
    """It was `I/O error: ... meta.json` (exit 1); `tasks.evaluate.run` says the same mistake as exit 2."""
    from trainer.export import main
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/config.json").write_text("{}")
    for folder, line in ((tmp_path / "nosuch", "no such folder"),
                         (tmp_path / "hf", "not a checkpoint (no meta.json): a Hugging Face model, exported already")):
        assert main([str(folder), str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err == f"input file error: {folder}: {line}\n"
    assert not (tmp_path / "out").exists()


def test_latest_names_a_checkpoint_or_falls_back_to_the_newest_complete_one(tmp_path):
    """An empty `latest` (a node crash before the pointer's bytes reached the disk) named the checkpoints
    folder itself, and the train stage died on int('checkpoints')."""
    from trainer.checkpoint import latest
    for step in (4, 8):
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}/meta.json").write_text("{}")
    (tmp_path / "step-00000012.partial").mkdir()
    for pointer, named in (("step-00000004", "step-00000004"), ("", "step-00000008"), ("..", "step-00000008"),
                           ("step-00000099", "step-00000008"), ("\x00\x00", "step-00000008")):
        (tmp_path / "latest").write_text(pointer)
        assert latest(tmp_path) == tmp_path / named, pointer


def test_export_into_the_current_folder_and_without_a_tokenizer(tmp_path, monkeypatch, capsys):
    """`python -m trainer.export CKPT .` failed ('PosixPath('.') has an empty name'), and an export without
    --tokenizer claimed token 0 as its end of text."""
    from trainer.export import main
    from tests.test_eval_history import make_run
    ckpt = make_run(tmp_path / "run")[0] / "step-00000010"
    (tmp_path / "here").mkdir()
    (tmp_path / "here/generation_config.json").write_text("{}")  # an earlier export's, with a tokenizer
    monkeypatch.chdir(tmp_path / "here")
    assert main([str(ckpt), "."]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "here/config.json").read_text())
    assert config["eos_token_id"] is None and config["bos_token_id"] is None
    assert sorted(f.name for f in (tmp_path / "here").iterdir()) == ["config.json", "model.safetensors"]
