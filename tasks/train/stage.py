"""Stage `train`: the GPT trained on the `tokenize` stage's blend, as one declared global pass.
  model (global)  launches the 3D-parallel run (torchrun, tp x pp x dp local ranks) with its output in
                  data/train/work/ (checkpoints survive a killed stage: a rerun resumes from the latest),
                  then assembles data/train/model/: the final checkpoint (layout-independent), the
                  per-step metrics.csv, the Hugging Face export (hf/) and the run's report.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from tasks.core.config import PipelineParams
from tasks.core.errors import from_line
from tasks.core.stage import Context, GlobalPass, Stage
from trainer.config import TrainParams, padded_vocab, plan

NAME = "train"
CURVE_POINTS = 200  # the loss curve kept in stats.json (the full one is metrics.csv)


def blend_files(ctx: Context) -> tuple[Path, Path, Path]:
    root = Path(ctx.data_dir) / "tokenize"
    return root / "blend", root / "datasets", root / "tokenizer" / "tokenizer.json"


def train_params(p: PipelineParams, ctx: Context) -> TrainParams:
    """The run's parameters: the section's shape and recipe, the blend's context length, and the
    tokenizer's vocabulary padded to a multiple of 128 x tp (Megatron)."""
    from tasks.tokenize.blend import REPORT
    from tasks.tokenize.pieces import read_manifest
    blend, datasets, _ = blend_files(ctx)
    seq = json.loads((blend / REPORT).read_text(encoding="utf-8"))["seq_length"]
    vocab = read_manifest(datasets)["vocab_size"]
    return p.train.for_data(seq, padded_vocab(vocab, p.train.parallel.tp))


def _inputs(p: PipelineParams, ctx: Context) -> list[str]:
    from tasks.tokenize.blend import REPORT
    from tasks.tokenize.pieces import MANIFEST
    blend, datasets, tokenizer = blend_files(ctx)
    return [str(blend / REPORT), str(datasets / MANIFEST), str(tokenizer)]


def _fresh_work(work: Path, spec_json: str) -> None:
    """Keep the work folder (and its checkpoints) only for the very same run."""
    spec_file = work / "run.json"
    if spec_file.is_file() and spec_file.read_text(encoding="utf-8") == spec_json:
        return
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec_file.write_text(spec_json, encoding="utf-8")


def _metrics(path: Path) -> list[dict]:
    import csv
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def build_model(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    from trainer import checkpoint, launch
    from trainer.export import export
    from tasks.tokenize.blend import REPORT
    from trainer.run import RunSpec
    from trainer.schedule import whole_batches
    cfg = train_params(p, ctx)
    plan(cfg.model, cfg.parallel, cfg.parallel.world_size)  # a bad layout fails here, before any launch
    blend, datasets, tokenizer = blend_files(ctx)
    work = ctx.root / "work"
    spec = RunSpec(train=cfg, out=str(work), blend_dir=str(blend.resolve()), datasets_dir=str(datasets.resolve()))
    _fresh_work(work, spec.model_dump_json())
    try:
        launch.run("trainer.run", work / "run.json", cfg.parallel.world_size, work / "launch.log",
                   timeout=7 * 24 * 3600, echo=sys.stderr.buffer)
    except launch.LaunchFailed as e:  # the rank's own line, label and exit code
        raise from_line(e.line, f" (stage 'train', log: {work / 'launch.log'})") from None
    final = checkpoint.latest(work / "checkpoints")
    shutil.copytree(final, tmp / "checkpoint")
    shutil.copyfile(work / "metrics.csv", tmp / "metrics.csv")
    export(tmp / "checkpoint", tmp / "hf", tokenizer)
    meta = checkpoint.read_meta(final)
    samples = json.loads((blend / REPORT).read_text(encoding="utf-8"))["samples"]
    rows = _metrics(tmp / "metrics.csv")
    every = max(1, len(rows) // CURVE_POINTS)
    m = cfg.model
    params = m.vocab_size * m.d_model + m.seq_len * m.d_model + 2 * m.d_model \
        + m.n_layer * (12 * m.d_model * m.d_model + 13 * m.d_model)
    report = {"steps": meta["step"], "tokens": meta["consumed_tokens"], "samples": meta["consumed_samples"],
              "train_tokens": cfg.schedule.train_tokens or whole_batches(
                  samples, cfg.schedule, cfg.parallel, m.seq_len) * m.seq_len,
              "global_batch": cfg.parallel.global_batch, "parameters": params,
              "layout": meta["layout"], "final_loss": float(rows[-1]["loss"]) if rows else None,
              "first_loss": float(rows[0]["loss"]) if rows else None,
              "tokens_per_s": statistics.median(float(r["tokens_per_s"]) for r in rows) if rows else None,
              "loss_curve": [[int(r["step"]), float(r["loss"])] for r in rows[::every]],
              "model": m.model_dump()}
    (tmp / "train_report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


STAGE = Stage(
    name=NAME, section="train", input=lambda p: p.train.input_stage,
    doc="A GPT trained with tensor, pipeline and data parallelism on the blend; checkpoint + HF export.",
    passes=(GlobalPass("model", build=build_model, params=lambda p: p.train.model_dump(), inputs=_inputs),),
    suite="tasks.validation.train",
)
