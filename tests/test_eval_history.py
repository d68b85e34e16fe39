"""Recurring evaluation: new checkpoints evaluated once each, none half-written, a crash resumed, damaged
or vanishing checkpoints named or skipped (the Prefect side: test_eval_schedule.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import save_file

from tasks.core.errors import ConfigError, StageBusy
from tasks.evaluate import history
from tasks.evaluate.config import EvaluateParams
from tasks.tokenize import tokenizer as tokenizers
from trainer.config import ModelParams
from trainer.model import GPT

P = ModelParams(n_layer=1, n_head=2, d_model=32, seq_len=64, vocab_size=1024, fused_kernels=False)
CFG = EvaluateParams(tasks=["boolq", "wic"], shots=["zero"], limit=4)


def make_run(root: Path) -> tuple[Path, Path]:
    """A tokenizer and a training run's checkpoint folder: two complete checkpoints and one being written."""
    tok = tokenizers.train([["The cat sat on the mat. Is the sky blue? No."] * 50], vocab_size=300, min_frequency=1)
    (root / "tokenizer").mkdir(parents=True)
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    ckpts = root / "checkpoints"
    for step in (10, 20, 30):
        folder = ckpts / (f"step-{step:08d}" + (".partial" if step == 30 else ""))
        folder.mkdir(parents=True)
        save_file({f"param/{n}": t.detach().contiguous() for n, t in GPT(P, seed=step).named_parameters()},
                  str(folder / "stage-0.safetensors"))
        meta = {"format": 1, "step": step, "consumed_tokens": step * 512, "consumed_samples": step * 8,
                "adam_step": step, "model": P.model_dump(), "layout": {"tp": 1, "pp": 1, "dp": 1}}
        if step != 30:  # meta.json is written last
            (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return ckpts, root / "tokenizer" / "tokenizer.json"


def test_each_complete_checkpoint_is_evaluated_once(tmp_path, benchmarks_dir):
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    new = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    assert [e["step"] for e in new] == [10, 20] and [e["tokens"] for e in new] == [5120, 10240]
    assert set(new[0]["metrics"]) == {"boolq/0-shot/acc", "wic/0-shot/acc"}
    assert history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {}) == []  # nothing twice
    assert len(history.read_history(out)) == 2
    assert (out / history.results_folder(new[1]["checkpoint"], history.settings_of(CFG, benchmarks_dir)) / "results.json").is_file()
    (ckpts / "step-00000030.partial" / "meta.json").write_text(
        (ckpts / "step-00000020" / "meta.json").read_text().replace('"step": 20', '"step": 30'))
    (ckpts / "step-00000030.partial").rename(ckpts / "step-00000030")  # the save completes
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})] == [30]


def test_other_settings_evaluate_every_checkpoint_again_and_the_history_shows_one_settings(tmp_path, benchmarks_dir):
    """Adding a task, or changing limit or seed, left the evaluated checkpoints as they were: the published
    curve joined scores of different tasks or doc samples, and the new task had no score before the change."""
    from flows.eval_schedule import history_markdown
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    first = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    more = CFG.model_copy(update={"tasks": ["boolq", "wic", "piqa"]})
    again = history.evaluate_new(ckpts, tok, more, benchmarks_dir, out, {})
    assert [e["step"] for e in again] == [10, 20] and all("piqa/0-shot/acc" in e["metrics"] for e in again)
    assert history.evaluate_new(ckpts, tok, more, benchmarks_dir, out, {}) == []
    assert history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {}) == []  # back: the first results stand
    other_docs = CFG.model_copy(update={"limit": 3})
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, other_docs, benchmarks_dir, out, {})] == [10, 20]
    assert len(history.read_history(out)) == 6 and len({e["results"] for e in history.read_history(out)}) == 6
    # the scoring batch, the device and the generation samples leave the scores alone: nothing again
    same = CFG.model_copy(update={"token_budget": 4096, "device": "cpu", "generation": CFG.generation.model_copy(
        update={"max_new_tokens": 4})})
    assert history.evaluate_new(ckpts, tok, same, benchmarks_dir, out, {}) == []
    shown = history.current(history.read_history(out), history.settings_of(CFG, benchmarks_dir))
    assert shown == first
    text = history_markdown(shown, 0, history.settings_of(CFG, benchmarks_dir), 4)
    assert "Evaluated with: boolq, wic; 0-shot; 4 docs per task; seed 1234." in text
    assert "4 earlier entries of history.jsonl, evaluated with other settings, are not shown." in text
    assert "piqa" not in text


def test_other_task_files_evaluate_every_checkpoint_again(tmp_path, benchmarks_dir):
    """A review: paths.benchmarks_dir pointed at another copy of the sets (the official HellaSwag for the derived
    one), the scheduled pass evaluated nothing and the curve went on joining scores of the old files."""
    ckpts, tok = make_run(tmp_path)
    out, other = tmp_path / "history", tmp_path / "other-benchmarks"
    for task in ("boolq", "wic"):
        shutil.copytree(Path(benchmarks_dir) / task, other / task)
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, other, out, {})] == [10, 20]
    assert history.evaluate_new(ckpts, tok, CFG, other, out, {}) == []
    dev = other / "boolq" / "dev.jsonl"
    dev.write_text("".join(dev.read_text(encoding="utf-8").splitlines(keepends=True)[1:]), encoding="utf-8")
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, other, out, {})] == [10, 20]
    # entries recorded before the task files were: kept as current (their files are not known), not evaluated again
    lines = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    for e in lines:  # nor the code, recorded later still
        e["settings"].pop("data"), e["settings"].pop("code")
    (out / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert history.evaluate_new(ckpts, tok, CFG, other, out, {}) == []


def test_entries_from_before_settings_were_recorded_count_when_their_tasks_and_shots_match(tmp_path, benchmarks_dir):
    """Upgraded, a history without settings was evaluated again whole, and checkpoints pruned since fell out of
    the published curve."""
    from flows.eval_schedule import history_markdown
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    lines = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    (out / "history.jsonl").write_text("".join(json.dumps({k: v for k, v in e.items() if k != "settings"}) + "\n"
                                               for e in lines))
    assert history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {}) == []
    every = history.read_history(out)
    assert len(history.current(every, history.settings_of(CFG, benchmarks_dir))) == 2
    assert "2 of them were evaluated before entries recorded their settings" in history_markdown(
        history.current(every, history.settings_of(CFG, benchmarks_dir)), 0, history.settings_of(CFG, benchmarks_dir))
    one_shot = CFG.model_copy(update={"shots": ["one"]})  # other shots: evaluated again
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, one_shot, benchmarks_dir, out, {})] == [10, 20]


@pytest.mark.parametrize("damage", ["truncated", "a list", "no provenance"])
def test_a_damaged_unlisted_result_is_evaluated_again(tmp_path, benchmarks_dir, monkeypatch, damage):
    """A results.json evaluated but not listed (a crash between the two), then damaged, failed every later
    scheduled pass with a JSON error."""
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    first = history.read_history(out)[0]
    (out / "history.jsonl").write_text("")  # the crash: results written, history line not
    results = out / first["results"]
    text = results.read_text()
    results.write_text({"truncated": text[: len(text) // 2], "a list": "[]",
                        "no provenance": json.dumps({**json.loads(text), "provenance": None})}[damage])
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})] == [10, 20]
    assert json.loads(results.read_text())["key"] == first["checkpoint"]


def test_a_run_moved_aside_during_the_pass_is_listed_once(tmp_path, benchmarks_dir, monkeypatch):
    """A new run moved work/ to work.previous/ during the pass: the checkpoints evaluated from work/ were found
    again in work.previous/ and listed twice."""
    ckpts, tok = make_run(tmp_path)
    before = tmp_path / "work.previous" / "checkpoints"
    real = history.run

    def moving(folder, *args, **kwargs):
        if folder.name == "step-00000020" and ckpts.exists():
            before.parent.mkdir(parents=True)
            ckpts.rename(before)  # the run moves aside before step 20 is read
        return real(folder, *args, **kwargs)
    monkeypatch.setattr(history, "run", moving)
    said = []
    new = history.evaluate_new([ckpts, before], tok, CFG, benchmarks_dir, tmp_path / "history", {}, say=said.append)
    steps = [e["step"] for e in history.read_history(tmp_path / "history")]
    assert steps == [e["step"] for e in new] == [10, 20], said


def test_two_folders_are_one_pass_under_one_lock_each_listed_when_reached(tmp_path, benchmarks_dir):
    """The flow evaluated the current run's folder and the run before's as two passes: a command-line pass
    started between them made the flow stop as busy before it published anything."""
    ckpts, tok = make_run(tmp_path)
    before = tmp_path / "work.previous" / "checkpoints"
    out, refused = tmp_path / "history", []

    def meanwhile() -> None:  # runs once, before the first evaluation: another pass, then a run moved aside
        with pytest.raises(StageBusy):
            history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
        refused.append(True)
        before.mkdir(parents=True)
        shutil.copytree(ckpts / "step-00000020", before / "step-00000040")
        meta = json.loads((before / "step-00000040" / "meta.json").read_text())
        (before / "step-00000040" / "meta.json").write_text(json.dumps({**meta, "step": 40, "run": "before"}))
    new = history.evaluate_new([ckpts, before], tok, CFG, benchmarks_dir, out, {}, check=meanwhile)
    assert refused and [(e["step"], e["run"]) for e in new] == [(10, ""), (20, ""), (40, "before")]


def test_a_crash_mid_way_resumes_with_the_next_checkpoint(tmp_path, benchmarks_dir, monkeypatch):
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    real = history.run

    def crash_on_second(folder, *args):
        if folder.name == "step-00000020":
            raise RuntimeError("killed")
        return real(folder, *args)
    monkeypatch.setattr(history, "run", crash_on_second)
    with pytest.raises(RuntimeError):
        history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    assert [e["step"] for e in history.read_history(out)] == [10]
    assert not list(out.glob("step-00000020*")) and not list(out.glob(".step-00000020*"))
    monkeypatch.setattr(history, "run", real)
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})] == [20]


def test_another_runs_checkpoint_of_the_same_step_keeps_its_own_results(tmp_path, benchmarks_dir):
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    first = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    meta = ckpts / "step-00000010" / "meta.json"  # a new run writes its own step 10
    meta.write_text(meta.read_text().replace('"consumed_tokens": 5120', '"consumed_tokens": 5121'))
    again = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    assert [e["step"] for e in again] == [10] and again[0]["results"] != first[0]["results"]
    assert all((out / e["results"]).is_file() for e in history.read_history(out))
    assert json.loads((out / first[0]["results"]).read_text())["key"] == first[0]["checkpoint"]


def test_a_checkpoint_rewritten_while_evaluated_is_left_for_the_next_run(tmp_path, benchmarks_dir, monkeypatch):
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    real = history.run

    def rewrite_during(folder, *args):
        result = real(folder, *args)
        if folder.name == "step-00000010":
            (folder / "meta.json").write_text((folder / "meta.json").read_text().replace('"adam_step": 10', '"adam_step": 11'))
        return result
    monkeypatch.setattr(history, "run", rewrite_during)
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})] == [20]
    monkeypatch.setattr(history, "run", real)
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})] == [10]


def test_two_passes_never_run_at_once(tmp_path, benchmarks_dir):
    ckpts, tok = make_run(tmp_path)
    with history._lock(tmp_path / "history"):
        with pytest.raises(StageBusy, match="another evaluation of .* is running"):
            history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {})


@pytest.mark.parametrize("mismatch", ["tensors of another config", "a model field this code does not know"])
def test_a_checkpoint_that_does_not_fit_its_model_is_named_and_the_others_are_evaluated(tmp_path, benchmarks_dir, mismatch):
    """A review: a checkpoint whose tensors or tokenizer do not fit its model (ConfigError), or whose meta.json
    names a model field this code does not know (a pydantic error), failed the pass at once, on every scheduled
    run: no later checkpoint was evaluated, and the UI's history was not published again."""
    ckpts, tok = make_run(tmp_path)
    meta = json.loads((ckpts / "step-00000010" / "meta.json").read_text())
    if mismatch == "tensors of another config":
        meta["model"]["d_model"] = 64  # the config says one model, the tensors are another
        said = r"tensor wte.weight: shape \(1024, 32\) in the file, \(1024, 64\) in the model"
    else:
        meta["model"]["n_layers"] = meta["model"].pop("n_layer")
        said = r"meta.json: its model is not one this code builds \(.*\): the checkpoint step-00000010 is damaged"
    (ckpts / "step-00000010" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(history.CheckpointsUnreadable, match=f"1 checkpoint\\(s\\) of .* do not fit their model .*step-00000010 .*{said}"):
        history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {})
    assert [e["step"] for e in history.read_history(tmp_path / "history")] == [20]


def test_each_run_is_scored_with_the_tokenizer_its_folder_keeps(tmp_path, benchmarks_dir):
    """A review: the run before (work.previous/, moved aside by a run on a new blend) was scored with the new
    blend's tokenizer, silently where both pad to the same vocabulary (1024 here)."""
    ckpts, tok = make_run(tmp_path)
    other = tokenizers.train([["Some other words, and a second text. Yes or no?"] * 50], vocab_size=290, min_frequency=1)
    other.save(str(tmp_path / "new-blend.json"))
    cfg = EvaluateParams(tasks=["lambada"], shots=["zero"], limit=4)

    def perplexities(default: Path, out: str) -> list[float]:
        new = history.evaluate_new(ckpts, default, cfg, benchmarks_dir, tmp_path / out, {})
        return [e["metrics"]["lambada/0-shot/perplexity"] for e in new]
    trained_with = perplexities(tok, "a")
    assert perplexities(tmp_path / "new-blend.json", "b") != trained_with  # the wrong tokenizer scores otherwise
    shutil.copyfile(tok, ckpts.parent / "tokenizer.json")  # the train stage keeps the run's own
    assert history.run_tokenizer(ckpts, tmp_path / "new-blend.json") == ckpts.parent / "tokenizer.json"
    assert perplexities(tmp_path / "new-blend.json", "c") == trained_with


def test_files_the_evaluated_tasks_do_not_read_leave_the_history_as_it_is(tmp_path, benchmarks_dir):
    """A review: a README edited, another task's file touched or an editor's swap file evaluated every checkpoint
    again and hid the earlier ones (pruned by training since) from the curve. Entries whose task-file hash
    covered the whole folder still count while that folder is as it was."""
    ckpts, tok = make_run(tmp_path)
    out, copy = tmp_path / "history", tmp_path / "benchmarks"
    shutil.copytree(benchmarks_dir, copy)
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, copy, out, {})] == [10, 20]
    (copy / "README.md").write_text("edited\n")
    (copy / "piqa" / "valid-labels.lst").write_text("0\n")  # not evaluated (CFG: boolq, wic)
    (copy / "boolq" / ".dev.jsonl.swp").write_bytes(b"vim")
    assert history.evaluate_new(ckpts, tok, CFG, copy, out, {}) == []
    # as entries recorded it before: the whole folder's hash, and no code
    lines = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    for e in lines:
        e["settings"]["data"] = history.task_data(copy)
        e["settings"].pop("code")
    (out / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert history.evaluate_new(ckpts, tok, CFG, copy, out, {}) == []
    (copy / "README.md").write_text("edited again\n")  # the folder they hashed changed: their files may have
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, copy, out, {})] == [10, 20]


def test_other_evaluation_code_evaluates_every_checkpoint_again(tmp_path, benchmarks_dir):
    """A review: after a prompt or scoring change the old checkpoints kept their old code's scores beside the new
    ones' in one curve. The settings record the evaluation code's digest (comments and docstrings aside)."""
    ckpts, tok = make_run(tmp_path)
    out = tmp_path / "history"
    history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    settings = history.settings_of(CFG, benchmarks_dir)
    assert settings["code"] == history.loaded_code_digest(history.EVAL_CODE)
    lines = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    for e in lines:
        e["settings"]["code"] = "another prompt"
    (out / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert [e["step"] for e in history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})] == [10, 20]


@pytest.mark.parametrize("damage", ["truncated", "meta", "stage file missing", "meta without model", "meta a list"])
def test_a_damaged_checkpoint_is_named_and_the_others_are_evaluated(tmp_path, benchmarks_dir, damage):
    """One unreadable checkpoint failed the whole pass with a bare SafetensorError, on every scheduled run,
    and no later checkpoint was ever evaluated. So did a missing stage file ('no tensor param/wte.weight') and
    a meta.json of valid JSON that is no checkpoint's (KeyError: 'model'; TypeError), naming no checkpoint."""
    ckpts, tok = make_run(tmp_path)
    bad = ckpts / "step-00000010" / ("stage-0.safetensors" if damage in ("truncated", "stage file missing")
                                     else "meta.json")
    if damage == "stage file missing":
        bad.unlink()
    elif damage == "meta without model":
        bad.write_text(json.dumps({k: v for k, v in json.loads(bad.read_text()).items() if k != "model"}))
    elif damage == "meta a list":
        bad.write_text("[]")
    else:
        bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])
    out = tmp_path / "history"
    with pytest.raises(history.CheckpointsUnreadable) as failed:
        history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {})
    said = "is missing" if damage == "stage file missing" else "cannot be read"
    assert f"checkpoint file {bad} {said}" in str(failed.value) and "step-00000010" in str(failed.value)
    assert [e["step"] for e in failed.value.new] == [20] == [e["step"] for e in history.read_history(out)]
    assert not list(out.glob("*step-00000010*"))  # nothing half-written for it
    (ckpts / "step-00000010").rename(tmp_path / "removed")  # the operator removes it: the next pass is clean
    assert history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, out, {}) == []


@pytest.mark.parametrize("diverged", ["huge logits", "NaN weights"])
def test_a_diverged_checkpoint_is_recorded_as_it_scores_and_the_pass_goes_on(tmp_path, benchmarks_dir, diverged):
    """A run that diverged can save the step whose update made its weights huge or NaN: LAMBADA's perplexity
    overflowed math.exp, NaN log-likelihoods broke statistics.stdev and the sampled generation's multinomial,
    and the pass stopped at it on every scheduled run, leaving every later checkpoint unevaluated."""
    import math
    ckpts, tok = make_run(tmp_path)
    stage = ckpts / "step-00000010" / "stage-0.safetensors"
    state = {f"param/{n}": t.detach().clone().contiguous() for n, t in GPT(P, seed=10).named_parameters()}
    if diverged == "huge logits":
        state["param/ln_f.weight"] *= 1e4
    else:
        state["param/ln_f.weight"][0] = float("nan")
    save_file(state, str(stage))
    cfg = EvaluateParams(tasks=["lambada"], shots=["zero"], limit=4)
    new = history.evaluate_new(ckpts, tok, cfg, benchmarks_dir, tmp_path / "history", {})
    assert [e["step"] for e in new] == [10, 20]
    ppl = new[0]["metrics"]["lambada/0-shot/perplexity"]
    assert math.isinf(ppl) if diverged == "huge logits" else math.isnan(ppl)
    assert math.isfinite(new[1]["metrics"]["lambada/0-shot/perplexity"])


def test_a_hugging_face_folder_without_a_tokenizer_takes_the_one_given(tmp_path):
    """`python -m trainer.export ckpt out` without --tokenizer writes no tokenizer; the README's
    `python -m tasks.evaluate.run out --tokenizer tokenizer.json` then said the folder had none."""
    from tasks.core.errors import InputFileError
    from tasks.evaluate import model_io
    from trainer.export import export
    ckpts, tok = make_run(tmp_path)
    export(ckpts / "step-00000010", tmp_path / "hf")
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    with pytest.raises(InputFileError, match="no tokenizer .*give one with --tokenizer"):
        model_io.load(tmp_path / "hf")
    lm = model_io.load(tmp_path / "hf", tok)
    assert lm.eod == tokenizers.eod_id(tokenizers.load(tok))


def test_the_check_runs_once_before_the_first_evaluation_only(tmp_path, benchmarks_dir):
    """The flow checks the tokenizer against tokenize's marker: once, and not for a pass with nothing new."""
    ckpts, tok = make_run(tmp_path)
    calls = []
    history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {}, check=lambda: calls.append(1))
    assert calls == [1]
    history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {}, check=lambda: calls.append(2))
    assert calls == [1]

    def refuse():
        raise ConfigError("the tokenizer changed")
    (ckpts / "step-00000030.partial").rename(ckpts / "step-00000030")
    (ckpts / "step-00000030" / "meta.json").write_text((ckpts / "step-00000020" / "meta.json").read_text())
    with pytest.raises(ConfigError, match="the tokenizer changed"):
        history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {}, check=refuse)
    assert len(history.read_history(tmp_path / "history")) == 2


def test_the_published_history_tells_two_runs_apart():
    """After a seed change the table listed two runs' step 150 as two rows alike, and the plot joined both
    runs into one line per task."""
    from flows.eval_schedule import history_markdown
    one = [{"checkpoint": "step-00000150:aa", "run": "fc28b0ec99", "step": 150, "tokens": 153600,
            "metrics": {"boolq/0-shot/acc": 0.5}}]
    assert "| step | tokens | boolq/0-shot |" in history_markdown(one, 1)
    two = one + [{**one[0], "checkpoint": "step-00000150:bb", "run": "3a5571aa00", "metrics": {"boolq/0-shot/acc": 0.4}}]
    text = history_markdown(two, 1)
    assert "| step | run | tokens | boolq/0-shot |" in text and "|---|---|---|---|" in text
    assert "| 150 | fc28b0ec | 153,600 | 0.500 |" in text and "| 150 | 3a5571aa | 153,600 | 0.400 |" in text
    # a checkpoint whose meta.json records no tokens (another trainer's): it failed every later run's table
    assert "| 150 | ? | 0.500 |" in history_markdown([{**one[0], "tokens": None}], 1)
    assert history_markdown([], 0).endswith("| step | tokens |\n|---|---|")  # nothing yet: as many columns in both


def test_a_few_shot_k_equal_to_another_setting_is_scored_once():
    """fewshot_k 1 (or 0) is the one-shot (zero-shot) setting: it was scored twice and listed twice."""
    cfg = EvaluateParams(tasks=["boolq", "wic"], shots=["zero", "one", "few"], fewshot_k={"boolq": 1, "wic": 4})
    assert cfg.shot_counts("boolq") == [0, 1] and cfg.shot_counts("wic") == [0, 1, 4]


def test_history_entries_name_their_run(tmp_path, benchmarks_dir):
    ckpts, tok = make_run(tmp_path)
    meta = ckpts / "step-00000010" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "run": "the run's identity"}))
    new = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {})
    assert [e["run"] for e in new] == ["the run's identity", ""]  # step 20 was written before runs were recorded


def test_a_checkpoint_gone_between_its_listing_and_its_load_is_skipped(tmp_path, benchmarks_dir):
    """Gone before its weights were read, the folder raised InputFileError ('neither a checkpoint nor a Hugging
    Face model'), which failed the pass and left every later checkpoint unevaluated. Found by an operator drill."""
    import shutil
    ckpts, tok = make_run(tmp_path)
    said = []
    new = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {},
                               check=lambda: shutil.rmtree(ckpts / "step-00000010"), say=said.append)
    assert [e["step"] for e in new] == [20]
    assert said == [f"evaluate: {ckpts / 'step-00000010'} {history.GONE}; skipped"]


def test_a_checkpoint_pruned_as_its_files_are_opened_is_skipped_not_called_damaged(tmp_path, benchmarks_dir,
                                                                                   monkeypatch, capsys):
    """Training prunes old checkpoints while the schedule evaluates: a stage file listed and then gone is a
    removed checkpoint, not a damaged one (it failed the whole pass as 'cannot be read', exit 2)."""
    import shutil
    from trainer import checkpoint
    ckpts, tok = make_run(tmp_path)
    real = checkpoint.safe_open

    def pruned_first(path, *args, **kwargs):
        if "step-00000010" in str(path) and (ckpts / "step-00000010").exists():
            shutil.rmtree(ckpts / "step-00000010")  # training's prune lands between the listing and the open
        return real(path, *args, **kwargs)
    monkeypatch.setattr(checkpoint, "safe_open", pruned_first)
    new = history.evaluate_new(ckpts, tok, CFG, benchmarks_dir, tmp_path / "history", {})
    assert [e["step"] for e in new] == [20]
    assert f"{ckpts / 'step-00000010'} was removed or moved while being evaluated" in capsys.readouterr().err
