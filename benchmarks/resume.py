"""Checkpoint / resume / export benchmark (CPU, torchrun on local gloo ranks, mock data).

    python -m benchmarks.resume [--steps 8] [--kill-steps 24]

(a) kill -9: a run at (tp, pp, dp) = (1, 2, 1) killed once step 5 is logged, then restarted; it resumes
    from its latest checkpoint. resume_max_abs_diff: the largest |loss difference| of any step
    against the same run uninterrupted (goal 0: bit-exact).
(b) layout change: a run at (2, 2, 1) checkpoints at step 4; resumes from it at (2, 2, 1), (1, 2, 2) and
    (2, 1, 1). layout_resume_max_rel_diff: the largest relative loss difference of the other layouts'
    later steps against the same-layout resume.
(c) export: the last checkpoint to Hugging Face GPT-2 format; export_max_abs_diff: the largest
    |logit difference| between transformers' GPT2LMHeadModel and our model on the same tokens (fp32).
The last line is `resume_max_abs_diff=<d> layout_resume_max_rel_diff=<d> export_max_abs_diff=<d>`.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from trainer import checkpoint
from trainer.config import ModelParams, OptimParams, ParallelParams, ScheduleParams, TrainParams
from trainer.parity import worst
from trainer.run import RunSpec, launch, launch_and_kill

MODEL = ModelParams(n_layer=4, n_head=4, d_model=64, vocab_size=512, seq_len=32, fused_kernels=False)
BATCH = 8


def spec(out: Path, steps: int, tp: int, pp: int, dp: int, init_from: Path | None = None, every: int = 2) -> RunSpec:
    t = TrainParams(model=MODEL, parallel=ParallelParams(tp=tp, pp=pp, dp=dp, micro_batch=2, global_batch=BATCH),
                    optim=OptimParams(lr=1e-3), checkpoint_every=every, keep_checkpoints=10, seed=7,
                    schedule=ScheduleParams(train_tokens=steps * BATCH * MODEL.seq_len,
                                            warmup_tokens=2 * BATCH * MODEL.seq_len))
    return RunSpec(train=t, out=str(out), mock_samples=10_000, init_from=str(init_from) if init_from else None)


def kill_and_resume(tmp: Path, steps: int) -> float:
    # checkpoints every 4 steps: the kill after step 5 lands past the step-4 checkpoint, so steps are redone
    reference = launch(spec(tmp / "uninterrupted", steps, 1, 2, 1, every=4))
    killed = spec(tmp / "killed", steps, 1, 2, 1, every=4)
    last = launch_and_kill(killed, after_step=5)
    print(f"killed with step {last} of {steps} logged; latest checkpoint: "
          f"{checkpoint.latest(tmp / 'killed/checkpoints').name}")
    resumed = launch(killed)
    print(f"{'step':>4}{'uninterrupted':>16}{'killed + resumed':>18}")
    for k in sorted(reference):
        print(f"{k:>4}{reference[k]:>16.9f}{resumed[k]:>18.9f}")
    return worst(abs(reference[k] - resumed[k]) for k in reference)


def layout_resume(tmp: Path, steps: int) -> tuple[float, Path]:
    launch(spec(tmp / "written-221", steps, 2, 2, 1))
    at4 = tmp / "written-221/checkpoints/step-00000004"
    runs = {lay: launch(spec(tmp / f"resumed-{lay}", steps, *map(int, lay), init_from=at4))
            for lay in ("221", "122", "211")}
    print(f"{'step':>4}" + "".join(f"{'resumed at ' + lay:>18}" for lay in runs))
    for k in sorted(runs["221"]):
        print(f"{k:>4}" + "".join(f"{r[k]:>18.9f}" for r in runs.values()))
    same = runs["221"]
    diff = worst(abs(r[k] - same[k]) / abs(same[k]) for lay, r in runs.items() if lay != "221" for k in same)
    return diff, checkpoint.latest(tmp / "written-221/checkpoints")


def export_diff(folder: Path, tmp: Path) -> float:
    from transformers import GPT2LMHeadModel

    from trainer.export import export
    from trainer.model import GPT
    out = export(folder, tmp / "hf")
    ours = GPT(ModelParams(**checkpoint.read_meta(folder)["model"]))  # as trained: the vocabulary padded
    tensors = checkpoint.Tensors(folder)
    ours.load_state_dict({k: tensors[f"param/{k}"] for k in ours.state_dict()})
    theirs = GPT2LMHeadModel.from_pretrained(out).eval()
    tokens = torch.randint(0, MODEL.vocab_size, (4, MODEL.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((ours(tokens) - theirs(tokens).logits).abs().max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="steps of the layout-change runs")
    ap.add_argument("--kill-steps", type=int, default=24, help="steps of the killed run (killed after step 5)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        resume = kill_and_resume(tmp, args.kill_steps)
        layout, last = layout_resume(tmp, args.steps)
        exported = export_diff(last, tmp)
    print(f"resume_max_abs_diff={resume:.3g} layout_resume_max_rel_diff={layout:.3g} export_max_abs_diff={exported:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
