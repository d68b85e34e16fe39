"""Stage `train`: the GPT trained on the `tokenize` stage's blend, as one declared global pass.
  model (global)  launches the 3D-parallel run (torchrun, tp x pp x dp local ranks) with its output in
                  data/train/work/ (checkpoints survive a killed stage: a rerun of the same run resumes
                  from the latest, at whatever layout params.yaml now gives),
                  then assembles data/train/model/: the final checkpoint (layout-independent), the
                  per-step metrics.csv, the Hugging Face export (hf/) and the run's report.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import sys
from pathlib import Path

from tasks.core.config import PipelineParams
from tasks.core.errors import ConfigError, TrainingError, from_line
from tasks.core.notices import notice
from tasks.core.passes import atomic_path
from tasks.core.stage import Context, GlobalPass, Stage
from tasks.train import work_folder
from trainer.config import TrainParams, padded_vocab, plan, recipe_model

NAME = "train"
CURVE_POINTS = 200  # the loss curve kept in stats.json (the full one is metrics.csv)


def blend_files(ctx: Context) -> tuple[Path, Path, Path]:
    root = Path(ctx.data_dir) / "tokenize"
    return root / "blend", root / "datasets", root / "tokenizer" / "tokenizer.json"


def blend_facts(ctx: Context) -> tuple[dict, int]:
    """The finished blend's report (context length, samples) and the tokenizer's vocabulary (unpadded)."""
    from tasks.tokenize.blend import REPORT
    from tasks.tokenize.pieces import read_manifest
    blend, datasets, _ = blend_files(ctx)
    return json.loads((blend / REPORT).read_text(encoding="utf-8")), read_manifest(datasets)["vocab_size"]


def train_params(p: PipelineParams, seq: int, vocab: int) -> TrainParams:
    """The run's parameters: the chosen profile's shape and recipe, the blend's context length, and the
    tokenizer's vocabulary padded to a multiple of 128 x tp (Megatron)."""
    return p.train.for_data(seq, padded_vocab(vocab, p.train.recipe.parallel.tp))


def _inputs(p: PipelineParams, ctx: Context) -> list[str]:
    from tasks.tokenize.blend import REPORT
    from tasks.tokenize.pieces import MANIFEST
    blend, datasets, tokenizer = blend_files(ctx)
    return [str(blend / REPORT), str(datasets / MANIFEST), str(tokenizer)]


def run_identity(cfg: TrainParams, ctx: Context) -> str:
    """What makes a run the same run: the model, recipe, seed and the blend it reads. Layout,
    checkpoint cadence and MFU peak may change and the run resumes (checkpoints are layout-independent).
    train_tokens given as the number a kept run with train_tokens 0 resolved to (its checkpoints record it)
    is that run: pinning the number its report showed started another run from step 0, moving it aside."""
    given = _identity(cfg, ctx)
    if not cfg.schedule.train_tokens or work_folder.holds(ctx.root / "work", given):
        return given
    as_zero = _identity(cfg.model_copy(update={"schedule": cfg.schedule.model_copy(update={"train_tokens": 0})}), ctx)
    meta = work_folder.resumes_from(ctx.root / "work", as_zero)
    return as_zero if meta is not None and meta.get("train_tokens") == cfg.schedule.train_tokens else given


def _identity(cfg: TrainParams, ctx: Context) -> str:
    from tasks.tokenize.blend import REPORT
    from tasks.tokenize.pieces import MANIFEST
    blend, datasets, tokenizer = blend_files(ctx)
    data = [(blend / REPORT).read_text(encoding="utf-8"), (datasets / MANIFEST).read_text(encoding="utf-8"),
            tokenizer.read_text(encoding="utf-8")]
    cfg = cfg.model_copy(update={"model": recipe_model(cfg.model)})  # not how it is computed (HOW_COMPUTED)
    run = {k: getattr(cfg, k).model_dump() if hasattr(getattr(cfg, k), "model_dump") else getattr(cfg, k)
           for k in ("model", "optim", "schedule", "seed")}
    return hashlib.sha256(json.dumps([run, data], sort_keys=True).encode()).hexdigest()


def _metrics(path: Path) -> list[dict]:
    import csv
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def check_run(p: PipelineParams, ctx: Context) -> tuple[dict, TrainParams, list[dict], str]:
    """The refusals of the run itself (the stage's declared check, and again in the pass): the blend's
    facts, the run's parameters, every profile sized and the run's identity. A bad layout or more train_tokens than the blend
    holds fail in a second. (Whether this machine can launch it is checked in the pass, before the launch:
    a model already trained elsewhere is reused here without one.)"""
    from trainer.schedule import check, global_batch, samples_needed, within_data
    from tasks.train.profiles import sized_profiles
    facts, vocab = blend_facts(ctx)
    seq = facts["seq_length"]
    cfg = train_params(p, seq, vocab)
    try:
        plan(cfg.model, cfg.parallel, cfg.parallel.world_size)
    except ConfigError as e:  # name the profile, as sized_profiles does for the others
        raise ConfigError(f"train.profiles.{p.train.profile}: {e}") from None
    sized = sized_profiles(p.train, vocab, seq)
    check(cfg.schedule, cfg.parallel)  # a bad ramp, and a batch larger than the blend: before any folder moves
    if not within_data(cfg.schedule, cfg.parallel, seq, facts["samples"]).train_tokens:
        raise ConfigError(f"profile {p.train.profile!r}: the blend has {facts['samples']:,} samples of {seq} tokens, "
                          f"fewer than one global batch ({global_batch(0, cfg.schedule, cfg.parallel, seq):,})")
    identity = run_identity(cfg, ctx)
    # a blend smaller than the budget (tokenize builds train_tokens // seq_length samples for one) is refused
    # here, not at the last step it can take; one built for this budget whose last batch would run past it
    # trains its whole batches (trainer.schedule.within_data), a run resumed at another global batch too
    if facts["samples"] < cfg.schedule.train_tokens // seq:
        needed = samples_needed(cfg.schedule, cfg.parallel, seq)
        raise ConfigError(f"profile {p.train.profile!r}: train_tokens {cfg.schedule.train_tokens:,} need {needed:,} "
                          f"samples of {seq} tokens and the blend has {facts['samples']:,}: a larger blend "
                          f"(tokenize.train_tokens) or fewer train_tokens")
    return facts, cfg, sized, identity


def build_model(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    from tasks.core import lifeline
    from trainer import checkpoint, launch
    from trainer.export import export
    from trainer.run import RunSpec
    from trainer.schedule import whole_batches
    from trainer.size import parameters
    from tasks.train.profiles import check_launchable
    work = ctx.root / "work"
    # a killed run's last ranks are gone (their last checkpoint saved) before the run is sized from its resume
    # point, and before its folder is reused or moved
    lifeline.wait_for_ranks(work)
    facts, cfg, sized, identity = check_run(p, ctx)  # the identity read after the wait: the run as it stands
    check_launchable(p.train, next(r for r in sized if r["profile"] == p.train.profile))  # before any rank starts
    blend, datasets, tokenizer = blend_files(ctx)
    spec = RunSpec(train=cfg, out=str(work), blend_dir=str(blend.resolve()), datasets_dir=str(datasets.resolve()),
                   launch=p.train.launch)
    spec = spec.model_copy(update={"run_id": identity})  # its checkpoints record it (the scheduled evaluation)
    work_folder.prepare(work, identity)
    keep_tokenizer(work, tokenizer)
    start = checkpoint.latest(work / "checkpoints")
    resumed_from = int(start.name.removeprefix("step-")) if start is not None else 0  # read by the ranks, not here
    if start is not None:
        notice(f"train: resuming the run in {work} from its checkpoint {start.name}")
    (work / "run.json").write_text(spec.model_dump_json(), encoding="utf-8")
    try:
        launch.run("trainer.run", work / "run.json", cfg.parallel.world_size, work / "launch.log",
                   timeout=p.train.launch.timeout_s, echo=sys.stderr.buffer, launch=p.train.launch)
    except launch.LaunchTimedOut as e:
        raise TrainingError(f"every rank was stopped after train.launch.timeout_s ({e.timeout:g} s); a rerun resumes "
                            f"from the last checkpoint saved (stage 'train', log: {work / 'launch.log'})") from None
    except launch.LaunchFailed as e:  # the rank's own line, label and exit code
        raise from_line(e.line, f" (stage 'train', log: {work / 'launch.log'})") from None
    final = checkpoint.latest(work / "checkpoints")
    shutil.copytree(final, tmp / "checkpoint")
    shutil.copyfile(work / "metrics.csv", tmp / "metrics.csv")
    export(tmp / "checkpoint", tmp / "hf", tokenizer)
    meta = checkpoint.read_meta(final)
    samples = facts["samples"]
    rows = _metrics(tmp / "metrics.csv")
    every = max(1, len(rows) // CURVE_POINTS)
    m = cfg.model
    report = {"profile": p.train.profile, "steps": meta["step"], "tokens": meta["consumed_tokens"], "samples": meta["consumed_samples"],
              # what the run trained to (its last checkpoint records it), else what params.yaml asks
              "train_tokens": meta.get("train_tokens") or cfg.schedule.train_tokens or whole_batches(
                  samples, cfg.schedule, cfg.parallel, m.seq_len) * m.seq_len,
              # the batch the last step trained at (metrics.csv), not params.yaml's: a finished run resumed with
              # another global_batch trains no step at it
              "global_batch": int(rows[-1]["global_batch"]) if rows else cfg.parallel.global_batch,
              "resumed_from_step": resumed_from, "parameters": parameters(m),
              "layout": meta["layout"], "kernels": meta.get("kernels"), "final_loss": float(rows[-1]["loss"]) if rows else None,
              "first_loss": float(rows[0]["loss"]) if rows else None,
              "tokens_per_s": statistics.median(float(r["tokens_per_s"]) for r in rows) if rows else None,
              "loss_curve": [[int(r["step"]), float(r["loss"])] for r in rows[::every]],
              "peak_tflops": cfg.peak_tflops, "model": m.model_dump(), "profiles": sized}
    (tmp / "train_report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def keep_tokenizer(work: Path, tokenizer: Path) -> None:
    """The run's folder keeps the tokenizer it trains with (its identity includes the text): the scheduled
    evaluation scores its checkpoints with it, after a new blend's run moved it to work.previous/ too."""
    own = work / "tokenizer.json"
    data = tokenizer.read_bytes()
    if own.is_file() and own.read_bytes() == data:
        return
    with atomic_path(own) as tmp:
        tmp.write_bytes(data)


def progress(p: PipelineParams, since: float) -> tuple[float, str] | None:
    """The run's progress from the progress.json rank 0 replaces each step (one written after `since`,
    a time.time(), so a finished earlier run's file does not count): fraction of tokens, and a line."""
    path = Path(p.paths.data_dir) / NAME / "work" / "progress.json"
    try:
        if path.stat().st_mtime < since:
            return None
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not there yet, or replaced while read
        return None
    done, total = int(d["tokens"]), max(1, int(d["train_tokens"]))
    rate = d["run_tokens"] / d["run_seconds"] if d["run_seconds"] > 0 else 0.0
    eta = f", ETA {_clock((total - done) / rate)}" if rate > 0 and done < total else ""
    mfu = f", MFU {float(d['mfu']):.1%}" if d.get("mfu") else ""
    return min(1.0, done / total), (f"train step {d['step']}: loss {float(d['loss']):.4f}, lr {float(d['lr']):.3g}, "
                                    f"batch {d['global_batch']}, {done:,}/{total:,} tokens ({done / total:.0%}), "
                                    f"{float(d['tokens_per_s']):,.0f} tokens/s{mfu}{eta}")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _check(p: PipelineParams, ctx: Context) -> None:
    """check_run, and, where the run will train (its model is not done for these parameters and inputs),
    whether this machine can launch it: a profile it cannot is refused before the last model's results go."""
    from tasks.core.runner import global_pass_marked_done
    from tasks.train.profiles import check_launchable
    _, _, sized, _ = check_run(p, ctx)
    if not global_pass_marked_done(STAGE, STAGE.output_pass(), p, ctx):
        check_launchable(p.train, next(r for r in sized if r["profile"] == p.train.profile))


def warnings(stats: dict, p: PipelineParams) -> list[str]:
    """A warmup longer than the run: Megatron allows it, and the learning rate never reaches its peak. A
    global batch in params.yaml that the run's last step did not train at: a finished run resumed with it
    (the batch is layout, as in Megatron: a resumed run goes on from its samples at the new batch). Fewer
    tokens trained than train_tokens: the blend built for them had no whole last batch. Fused kernels asked
    for on a GPU where they could not run (CuPy missing or unusable)."""
    out = []
    recipe = p.train.profiles[p.train.profile]
    warmup, trained = recipe.schedule.warmup_tokens, stats.get("tokens")
    if trained is not None and warmup > trained:
        out.append(f"train.profiles.{p.train.profile}.schedule.warmup_tokens ({warmup:,}) is more than the {trained:,} "
                   f"tokens trained: the learning rate rose to {trained / warmup:.1%} of its peak and never decayed")
    last = stats.get("global_batch")
    if last is not None and last != recipe.parallel.global_batch and not recipe.schedule.rampup_start:
        out.append(f"train.profiles.{p.train.profile}.parallel.global_batch is {recipe.parallel.global_batch} but the "
                   f"run's last step trained at {last} (it resumed from step {stats.get('resumed_from_step', 0)}; "
                   f"metrics.csv has the batch of every step)")
    given = recipe.schedule.train_tokens
    if given and stats.get("train_tokens") is not None and stats["train_tokens"] < given:
        out.append(f"train.profiles.{p.train.profile}.schedule.train_tokens is {given:,}: the blend's last batch "
                   f"would have run past its samples, so the run trained its whole batches, "
                   f"{stats['train_tokens']:,} tokens (Megatron leaves a partial last batch out too)")
    kernels = stats.get("kernels") or ""
    if recipe.model.fused_kernels and kernels.startswith("reference (") and kernels != "reference (no GPU)":
        out.append(f"train.profiles.{p.train.profile}.model.fused_kernels is on but the run trained on the torch "
                   f"reference path: {kernels[len('reference ('):-1]}")
    return out


STAGE = Stage(
    # dvc.yaml deps: its package and the code it imports (tests/test_layout.py checks it is all here)
    code=("tasks/train", "trainer", "kernels", "tasks/tokenize"),
    name=NAME, section="train", input=lambda p: p.train.input_stage,
    doc="A GPT trained with tensor, pipeline and data parallelism on the blend; checkpoint + HF export.",
    passes=(GlobalPass("model", build=build_model, params=lambda p: p.train.model_dump(exclude={"launch"}), inputs=_inputs),),
    suite="tasks.validation.train", progress=progress, check=_check, warnings=warnings,
)
