"""Layout-independent checkpoints: every tensor is stored whole, under the plain GPT's name, so a
checkpoint written at one (tp, pp, dp) resumes at any other and exports without a converter.

    <dir>/step-00000010/stage-<s>.safetensors  param/<name>, exp_avg/<name>, exp_avg_sq/<name> (fp32)
                        rng-<rank>.safetensors  the rank's torch RNG (restored at the same layout)
                        meta.json               step, data position, Adam step, fp16 loss scaler, model, layout,
                                                a sample digest of the weights (weights_sample)
    <dir>/latest                                the newest complete checkpoint's folder name

Writing: every rank gathers its parameters whole (the fp32 master and Adam moments over the ZeRO-1
replicas, then the tensor-parallel slices), the (data 0, model 0) rank of each stage writes its
stage's file into `step-N.partial/`, and rank 0 renames the folder and then replaces `latest`, so a
kill or a full disk during a save leaves the previous checkpoint the one that loads. Loading reads
safetensors and JSON only (no pickle).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from tasks.core.errors import ConfigError, InputFileError, TrainingError
from tasks.core.passes import remove_at_once
from trainer import rng
from trainer import tensor_parallel as tp
from trainer.config import HOW_COMPUTED
from trainer.model import kernel_path
from trainer.pipeline import plain_modules

KEYS = ("param", "exp_avg", "exp_avg_sq")
LATEST = "latest"


class CheckpointUnreadable(InputFileError):
    """A checkpoint file that cannot be read (truncated, overwritten): names the file; the other
    checkpoints may be fine (the scheduled evaluation goes on with them)."""


def _unreadable(path: Path, e: Exception) -> CheckpointUnreadable:
    cause = str(e).splitlines()[0] if str(e) else type(e).__name__
    return CheckpointUnreadable(f"checkpoint file {path} cannot be read ({type(e).__name__}: {cause}): the "
                                f"checkpoint {Path(path).parent.name} is damaged")


def _params(engine):
    """(plain name, module, attribute, parameter) for every parameter this rank holds, in module order."""
    for prefix, module in plain_modules(engine.ds.module, engine.model.n_layer):
        for attr, param in module.named_parameters(recurse=False):
            yield f"{prefix}.{attr}", module, attr, param


def _torch_optimizer(engine):
    """The torch AdamW inside DeepSpeed (inside the ZeRO-1 wrapper when there is one)."""
    opt = engine.ds.optimizer
    return getattr(opt, "optimizer", opt)


def _link_moments(engine) -> None:
    """Point every parameter's ZeRO fragment at its Adam moments. DeepSpeed links them once, right
    after the first param group's first step, when the later groups have no state yet (so with
    decay/no-decay groups the second group's `exp_avg` reads as missing); linking again is harmless."""
    opt = engine.ds.optimizer
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state"):
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()


def _get(engine, param, key: str) -> torch.Tensor:
    """This rank's part of a tensor whole over the data-parallel replicas (a collective under ZeRO)."""
    if hasattr(param, "_hp_mapping"):
        return param.get_full_hp_param(None if key == "param" else key).detach()
    if key == "param":
        return param.detach().float()
    return _torch_optimizer(engine).state[param][key].detach().float()


def _set(engine, param, key: str, value: torch.Tensor) -> None:
    with torch.no_grad():
        if key == "param":
            param.copy_(value.to(param.dtype))
        if hasattr(param, "_hp_mapping"):
            param.set_full_hp_param(value.to(param.device), None if key == "param" else key)
        elif key != "param":
            _torch_optimizer(engine).state[param][key].copy_(value)


def _whole(module, attr: str, local: torch.Tensor, group) -> torch.Tensor:
    """The full (tp = 1) tensor from every tensor-parallel rank's slice (a collective over tp)."""
    if group is None or not getattr(getattr(module, attr), "tensor_model_parallel", False):
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    dim = 1 if isinstance(module, tp.RowParallelLinear) else 0
    return torch.cat(parts, dim=dim)


def _adam_step(engine) -> int:
    """Adam's step count as the optimizer holds it (under fp16 a skipped step does not count)."""
    steps = [float(st["step"]) for st in _torch_optimizer(engine).state.values() if "step" in st]
    return int(max(steps, default=0))


SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")


def loss_scaler(engine):
    """DeepSpeed's dynamic fp16 loss scaler, or None (bf16/fp32, or a static scale): ZeRO's optimizer
    holds a DynamicLossScaler, DeepSpeed's fp16 optimizer without ZeRO a LossScaleConfig."""
    opt = engine.ds.optimizer
    scaler = getattr(opt, "loss_scaler", None) or getattr(opt, "loss_scale_config", None)
    dynamic = getattr(scaler, "dynamic", False) or getattr(scaler, "dynamic_loss_scale", False)
    return scaler if dynamic else None


def scaler_state(scaler) -> dict | None:
    """The scale and the counters that decide its next change (an overflow halves it after
    `hysteresis` overflows; `scale_window` clean steps since the last overflow double it)."""
    if scaler is None:
        return None
    return {k: getattr(scaler, k) for k in SCALER_FIELDS if hasattr(scaler, k)}


def restore_scaler(scaler, state: dict | None) -> None:
    """A resumed fp16 run goes on with the scale it had, not 2^16 again (which would skip steps to
    find it); a checkpoint without a scaler (bf16/fp32) leaves the fresh one."""
    if scaler is None or not state:
        return
    for k, v in state.items():
        if hasattr(scaler, k):
            setattr(scaler, k, v)


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state(), **rng.tracker_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _durable(folder: Path) -> None:
    """fsync every file and the folder itself, so the rename that publishes it survives a node crash."""
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _durable_entry(folder)


def _durable_entry(folder: Path) -> None:
    """fsync a folder: the renames into it survive a node crash."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_written(path: Path) -> None:
    """The mode any file written here gets (safetensors makes its file 0600: a worker or evaluation service
    running as another user read meta.json but not the weights)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def save(engine, directory: Path, step: int, state: dict, run: str = "") -> Path:
    """Write checkpoint `step` (every rank calls this); `state` is the run's position (JSON-able), `run`
    the run's identity, recorded in meta.json (the scheduled evaluation tells another run's step-N by it).
    A failed write (a full disk) stops the run with a TrainingError naming the step and the cause;
    `latest` still names the previous checkpoint, which is what a restart loads."""
    directory = Path(directory)
    final, partial = directory / f"step-{step:08d}", directory / f"step-{step:08d}.partial"
    try:
        return _save(engine, directory, final, partial, step, state, run)
    except Exception as e:  # noqa: BLE001 - safetensors reports I/O as its own SafetensorError
        if isinstance(e, TrainingError) or not _is_io(e):
            raise
        shutil.rmtree(partial, ignore_errors=True)  # give the space back: the run stops here
        previous = latest(directory)
        cause = e.strerror if isinstance(e, OSError) and e.strerror else _io_cause(str(e))
        raise TrainingError(f"checkpoint step {step} not saved in {directory}: {cause}; "
                            + (f"{previous.name} stays the latest" if previous else "there is no earlier checkpoint")
                            ) from None


def _is_io(e: Exception) -> bool:
    return isinstance(e, OSError) or "(os error " in str(e)


def _io_cause(message: str) -> str:
    """safetensors' `Error while serializing: I/O error: No space left on device (os error 28)` as
    the OS's words."""
    import re
    found = re.search(r"I/O error: (.+?) \(os error \d+\)", message)
    return found.group(1) if found else message.splitlines()[0] if message else "I/O error"


def _save(engine, directory: Path, final: Path, partial: Path, step: int, state: dict, run: str) -> Path:
    if engine.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a save that was killed
        partial.mkdir(parents=True)
    dist.barrier()
    group = engine.tensor_group
    writer = engine.coord.data == 0 and engine.coord.model == 0
    _link_moments(engine)
    tensors = {}
    for name, module, attr, param in _params(engine):
        for key in KEYS:  # every rank joins the gathers; only the stage's writer keeps the result
            whole = _whole(module, attr, _get(engine, param, key), group)
            if writer and not getattr(param, "ds_pipe_replicated", False):  # the tied copy: the first stage writes it
                tensors[f"{key}/{name}"] = whole.cpu().contiguous()
    if writer:
        save_file(tensors, str(partial / f"stage-{engine.coord.pipe}.safetensors"))
        _as_written(partial / f"stage-{engine.coord.pipe}.safetensors")
    del tensors
    save_file(_rng_state(), str(partial / f"rng-{engine.rank}.safetensors"))
    _as_written(partial / f"rng-{engine.rank}.safetensors")
    adam_step = _adam_step(engine)
    dist.barrier()
    if engine.rank == 0:
        meta = {"format": 1, "run": run, "step": step, **state, "adam_step": adam_step,
                "loss_scaler": scaler_state(loss_scaler(engine)), "model": engine.model.model_dump(),
                "kernels": kernel_path(engine.model, engine.device),
                "layout": {"tp": engine.par.tp, "pp": engine.par.pp, "dp": engine.par.dp},
                "weights_sample": weights_sample(partial)}
        (partial / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        _durable(partial)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        pointer = directory / f"{LATEST}.tmp"
        with open(pointer, "w", encoding="utf-8") as fh:  # a node crash left an empty pointer otherwise
            fh.write(final.name)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(pointer, directory / LATEST)
        _durable_entry(directory)
    dist.barrier()
    return final


def weights_sample(folder: Path, blocks: int = 8, block: int = 4096) -> str:
    """A digest of the stage files' names, sizes and `blocks` blocks spread over each (32 KiB read per file, at
    any size). meta.json records it: another save's weights give another meta.json, which the scheduled
    evaluation keys its results by (a run trained again from step 0 with the same parameters, after a fix,
    wrote a byte-identical meta.json, and its checkpoints were taken as evaluated); the same weights, the same
    digest (a deterministic rerun is not evaluated again)."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).glob("stage-*.safetensors")):
        size = path.stat().st_size
        h.update(path.name.encode() + b"\0" + size.to_bytes(8, "little"))
        with open(path, "rb") as fh:
            for k in range(blocks):
                fh.seek(size * k // blocks)
                h.update(fh.read(block))
    return h.hexdigest()[:16]


def prune(directory: Path, keep: int) -> None:
    """Remove all but the newest `keep` complete checkpoints up to the one `latest` names (rank 0
    only); a folder past it (a save killed between its rename and the pointer) is left alone. Each goes
    at once, renamed out of sight (`.pruned-step-N`) before it is deleted: a reader (the scheduled
    evaluation) finds it whole or gone, never half deleted, which read as a damaged checkpoint."""
    for left in Path(directory).glob(".pruned-step-*"):  # a prune killed while deleting
        shutil.rmtree(left, ignore_errors=True)
    current = latest(directory)
    if current is None:
        return
    done = sorted(p for p in Path(directory).glob("step-*")
                  if p.is_dir() and not p.name.endswith(".partial") and p.name <= current.name)
    for old in done[:-keep]:
        remove_at_once(old, old.with_name(f".pruned-{old.name}"), ignore_errors=True)


def latest(directory: Path) -> Path | None:
    """The checkpoint `latest` names; if that folder was removed (a damaged checkpoint deleted by hand, the
    usual way back to the one before), the newest complete checkpoint left."""
    pointer = Path(directory) / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8", errors="replace").strip()
    named = Path(directory) / name
    # only a checkpoint's own name: an empty pointer (a crash before its bytes reached the disk) named the
    # checkpoints folder itself, and the stage died on int('checkpoints')
    if re.fullmatch(r"step-\d+", name) and named.is_dir():  # (a damaged one too: read_meta names it)
        return named
    left = sorted(p for p in Path(directory).glob("step-*")
                  if p.is_dir() and not p.name.endswith(".partial") and (p / "meta.json").is_file())
    return left[-1] if left else None


def read_meta(folder: Path) -> dict:
    """The checkpoint's meta.json; one that does not describe a checkpoint, or a stage file its layout names that
    is not there, is a damaged checkpoint (CheckpointUnreadable): a KeyError or "no tensor param/wte.weight" named
    no checkpoint, and stopped the scheduled evaluation's pass before every later checkpoint."""
    path = Path(folder) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _unreadable(path, e) from None
    layout = meta.get("layout") if isinstance(meta, dict) else None
    if not (isinstance(meta, dict) and isinstance(meta.get("model"), dict) and isinstance(meta.get("step"), int)
            and isinstance(layout, dict) and isinstance(layout.get("pp"), int)):
        raise _unreadable(path, ValueError("it does not describe a checkpoint: model, step and layout"))
    for s in range(layout["pp"]):
        stage = Path(folder) / f"stage-{s}.safetensors"
        if not stage.is_file() and Path(folder).is_dir():  # a folder pruned meanwhile is gone, not damaged
            raise CheckpointUnreadable(f"checkpoint file {stage} is missing: the checkpoint {Path(folder).name} "
                                       f"is damaged")
    return meta


def check_model(meta: dict, model, folder: Path) -> None:
    """A checkpoint of another model config is refused, naming the fields that differ. How it is computed,
    its dropout and the spread of its initial weights (init_std, as Megatron's check_checkpoint_args) may."""
    mine = model.model_dump()
    differ = [f"{k} {meta['model'].get(k)!r} != {mine[k]!r}" for k in mine
              if k not in (*HOW_COMPUTED, "dropout", "init_std") and meta["model"].get(k) != mine[k]]
    if differ:
        raise ConfigError(f"checkpoint {folder} is of another model: " + ", ".join(differ))


class Tensors:
    """Whole tensors by name across a checkpoint's stage files (read lazily, no pickle)."""

    def __init__(self, folder: Path):
        self.files, self.paths = [], {}
        for path in sorted(Path(folder).glob("stage-*.safetensors")):
            try:
                self.files.append(safe_open(str(path), framework="pt"))
            except FileNotFoundError:  # removed (pruned) since listed: not damaged; the caller tells which
                raise
            except Exception as e:  # noqa: BLE001 - safetensors' own SafetensorError, which names no file
                raise _unreadable(path, e) from None
            self.paths[id(self.files[-1])] = path
        self.where = {k: f for f in self.files for k in f.keys()}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.where:
            raise ConfigError(f"checkpoint has no tensor {key}")
        try:
            return self.where[key].get_tensor(key)
        except Exception as e:  # noqa: BLE001
            raise _unreadable(self.paths[id(self.where[key])], e) from None

    def local(self, key: str, module, attr: str) -> torch.Tensor:
        """This rank's part only, read as a slice (a rank never holds a whole sharded tensor)."""
        if key not in self.where:
            raise ConfigError(f"checkpoint has no tensor {key}")
        try:
            view = self.where[key].get_slice(key)
            dim, start, stop = tp.local_range(module, attr, view.get_shape())
            index = tuple(slice(start, stop) if d == dim else slice(None) for d in range(len(view.get_shape())))
            return view[index]
        except Exception as e:  # noqa: BLE001
            if isinstance(e, ConfigError):
                raise
            raise _unreadable(self.paths[id(self.where[key])], e) from None


def load(engine, folder: Path, own: bool = True) -> dict:
    """Load checkpoint `folder` into this rank's stage at whatever layout it runs; returns meta. A damaged
    file stops the run naming it, and for one of the run's `own` checkpoints what to do: removing the folder
    resumes from the checkpoint before (of a checkpoint given to start from, that would mean nothing)."""
    try:
        return _load(engine, folder)
    except CheckpointUnreadable as e:
        if not own:
            raise
        before = [p for p in Path(folder).parent.glob("step-*") if p.is_dir() and p.name < Path(folder).name
                  and not p.name.endswith(".partial") and (p / "meta.json").is_file()]
        then = f"resume from {max(before).name}" if before else "start the run again (no checkpoint before it)"
        raise CheckpointUnreadable(f"{e}: remove {folder} to {then}") from None


def _load(engine, folder: Path) -> dict:
    meta = read_meta(folder)
    check_model(meta, engine.model, folder)
    tensors = Tensors(folder)
    opt = _torch_optimizer(engine)
    for group in opt.param_groups:  # Adam's state exists from the first step on: create it now
        for p in group["params"]:
            st = opt.state[p]
            st["step"] = torch.tensor(float(meta["adam_step"]))
            for key in KEYS[1:]:
                st.setdefault(key, torch.zeros_like(p, memory_format=torch.preserve_format))
    _link_moments(engine)
    for name, module, attr, param in _params(engine):
        for key in KEYS:
            _set(engine, param, key, tensors.local(f"{key}/{name}", module, attr))
    restore_scaler(loss_scaler(engine), meta.get("loss_scaler"))
    rng_file = Path(folder) / f"rng-{engine.rank}.safetensors"
    same_layout = meta["layout"] == {"tp": engine.par.tp, "pp": engine.par.pp, "dp": engine.par.dp}
    if same_layout and rng_file.is_file():
        try:
            with safe_open(str(rng_file), framework="pt") as f:
                torch.set_rng_state(f.get_tensor("torch"))
                if "cuda" in f.keys() and torch.cuda.is_available():
                    torch.cuda.set_rng_state(f.get_tensor("cuda"))
                if "tensor_parallel" in f.keys():  # checkpoints from before trainer/rng.py have none
                    rng.restore_tracker_state(f.get_tensor("tensor_parallel"))
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _unreadable(rng_file, e) from None
    return meta
