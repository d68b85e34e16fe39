"""One rank of a training run (launched by torchrun or the deepspeed launcher):

    python -m torch.distributed.run --nproc-per-node 2 -m trainer.run run.json

run.json is a RunSpec: the TrainParams, the output folder and the data (a finished blend, or mock
samples). A failure prints one line (`<label>: cause`) and exits with the project's exit code.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pydantic import Field

from tasks.core.config import Strict
from trainer.config import LaunchParams, TrainParams


class RunSpec(Strict):
    train: TrainParams
    out: str
    blend_dir: str | None = None
    datasets_dir: str | None = None
    mock_samples: int = Field(0, ge=0, description="Train on this many mock samples instead of a blend.")
    init_from: str | None = Field(None, description="A checkpoint folder (any layout) to start from when "
                                                    "`out` has none of its own.")
    launch: LaunchParams = LaunchParams()
    run_id: str = Field("", description="What makes this run this run, recorded in its checkpoints; empty: the "
                                         "digest of its model, optimizer, schedule and seed (trainer.loop).")
    hold_after_step: int = Field(0, ge=0, description="Operator drill (launch_and_kill): after this many steps the "
                                                      "ranks read no more data and wait to be killed; 0: never.")


def samples_of(spec: RunSpec):
    from trainer.data import HeldSamples, MockSamples, open_blend, samples_before_step
    if spec.mock_samples:
        m = spec.train.model
        samples = MockSamples(spec.mock_samples, m.seq_len, m.vocab_size, spec.train.seed)
    else:
        samples = open_blend(Path(spec.blend_dir), Path(spec.datasets_dir))
    if spec.hold_after_step:
        t = spec.train
        held_from = samples_before_step(spec.hold_after_step + 1, t.schedule, t.parallel, t.model.seq_len)
        return HeldSamples(samples, held_from)
    return samples


def launch(spec: RunSpec, timeout: float = 1800) -> dict[int, float]:
    """Run `spec` on its tp x pp x dp ranks (torchrun here, or the hostfile's hosts); returns the loss of every step in
    metrics.csv, or raises RuntimeError with the ranks' first error line."""
    from trainer import launch as launcher
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(spec.model_dump_json(), encoding="utf-8")
    launcher.run("trainer.run", out / "run.json", spec.train.parallel.world_size, out / "launch.log", timeout,
                 launch=spec.launch)
    return losses(out)


def launch_and_kill(spec: RunSpec, after_step: int, timeout: float = 900) -> int:
    """Operator drill: start `spec`, kill -9 every rank once step `after_step` is logged; returns the
    last step logged (`after_step`). The ranks read no data past that step (`hold_after_step`), so the
    kill lands there however slowly it follows: the steps left of a small run take less than a second,
    which a loaded machine's scheduling delay could outlast."""
    import time

    from tasks.core import lifeline
    from trainer import launch as launcher
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(spec.model_copy(update={"hold_after_step": after_step}).model_dump_json(), encoding="utf-8")
    proc = launcher.start("trainer.run", out / "run.json", spec.train.parallel.world_size, out / "launch.log",
                          spec.launch)
    metrics, deadline = out / "metrics.csv", time.monotonic() + timeout
    while not (metrics.is_file() and metrics.read_text().count("\n") > after_step):  # header + complete rows
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before step {after_step}")
        if time.monotonic() > deadline:
            launcher.stop(proc, grace_s=0)
            raise TimeoutError(f"no step {after_step} within {timeout} s")
        time.sleep(0.05)
    launcher.stop(proc, grace_s=0)  # the launcher and every rank, as a crash of the machine would
    proc.wait()
    lifeline.wait_for_ranks(out)
    if (out / "result.json").is_file():
        raise RuntimeError(f"the run finished before the kill after step {after_step} landed: give it more steps")
    return max(losses(out))


def losses(out: Path) -> dict[int, float]:
    import csv
    with (Path(out) / "metrics.csv").open(newline="") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}


def read_spec(path: Path) -> RunSpec:
    """run.json as the stage wrote it, UTF-8 (read in the locale's encoding, a Latin-1 locale took a project path
    with an 'é' for another folder, and every rank failed on a blend it could not find)."""
    return RunSpec.model_validate_json(Path(path).read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    from tasks.core import lifeline
    from tasks.core.errors import describe
    # first, before torch is imported: a rank does not outlive its launch (torchrun starts it in a
    # session of its own), and a launch into this folder waits until every rank has let go of it
    lifeline.watch("trainer.run")
    with lifeline.hold(Path(argv[0]).parent):
        try:
            from trainer.loop import train
            spec = read_spec(Path(argv[0]))
            Path(spec.out).mkdir(parents=True, exist_ok=True)  # every rank: whichever writes first finds it
            result = train(spec.train, samples_of(spec), Path(spec.out), spec.init_from and Path(spec.init_from),
                           spec.run_id)
        except Exception as e:  # noqa: BLE001 - one line and the exit code, as every entry point
            code, line = describe(e)
            print(line, file=sys.stderr, flush=True)
            return code
        if int(os.environ.get("RANK", "0")) == 0:
            (Path(spec.out) / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    if code:
        # a failed rank leaves at once, its line written: the interpreter's teardown of a process group whose
        # gloo threads still run can abort it ("terminate called without an active exception"), and torchrun
        # then reported that SIGABRT (launch.first_error), not the error every rank had just written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
