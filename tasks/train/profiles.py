"""The train stage's checks before a launch: every profile of params `train.profiles` validated and
sized (the report's table), the chosen one's ranks matched to the hostfile, or, without one, to this
machine (its GPUs and their memory under DS_ACCELERATOR=cuda, else its RAM), so a profile that cannot
run here fails in a second with the reason instead of starting 2240 processes."""
from __future__ import annotations

import os

from tasks.core.errors import ConfigError
from trainer.config import LaunchParams, TrainStageParams
from trainer.size import GIB


def sized_profiles(train: TrainStageParams, vocab: int, seq_len: int) -> list[dict]:
    """Each profile's parameters, GPUs and memory per GPU (at the blend's vocabulary; at the blend's
    context length unless the profile names its own); a layout that cannot work names its profile."""
    from trainer.size import report
    rows = []
    for name, recipe in train.profiles.items():
        try:
            rows.append(report(name, recipe, vocab, seq_len))
        except ConfigError as e:
            raise ConfigError(f"train.profiles.{name}: {e}") from None
    return rows


def this_machine() -> dict:
    """What torchrun can start ranks on here: the accelerator the ranks will use, and its capacity."""
    accel = os.environ.get("DS_ACCELERATOR") or "cpu"
    if accel == "cuda":
        import torch
        n = torch.cuda.device_count()
        gib = torch.cuda.get_device_properties(0).total_memory / GIB if n else 0.0
        return {"accelerator": "cuda", "devices": n, "gib_per_device": gib}
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return {"accelerator": accel, "devices": None, "gib_total": ram}


def check_launchable(train: TrainStageParams, sized: dict, machine: dict | None = None) -> None:
    """The chosen profile's ranks fit the hostfile (trainer.launch.check) or this one machine."""
    from trainer.launch import check
    launch: LaunchParams = train.launch
    ranks = sized["gpus"]
    name = train.profile
    # the hosts of a hostfile get this machine's DS_ACCELERATOR (trainer.launch.environment): this holds there too
    accel = machine["accelerator"] if machine else os.environ.get("DS_ACCELERATOR") or "cpu"
    if accel == "cpu" and train.profiles[name].optim.dtype == "fp16":
        # DeepSpeed has no fp16 on CPU: it failed in every rank, after the work folder moved
        raise ConfigError(f"profile {name!r} trains in fp16, which DeepSpeed does not support on CPU: use bf16 or "
                          f"fp32 here (train.profiles.{name}.optim.dtype), or a GPU machine")
    if launch.hostfile is not None:
        check(launch, ranks)
        return
    m = machine or this_machine()
    hint = "give train.launch.hostfile to run it on several hosts"
    if m["accelerator"] == "cuda":
        if ranks > m["devices"]:
            raise ConfigError(f"profile {name!r} needs {ranks} GPUs and this machine has {m['devices']}: {hint}")
        if sized["gib_per_gpu"] > m["gib_per_device"]:
            raise ConfigError(f"profile {name!r} needs ~{sized['gib_per_gpu']:.1f} GiB per GPU and this machine's "
                              f"have {m['gib_per_device']:.1f} GiB: {hint}")
    else:
        if ranks * sized["gib_per_gpu"] > m["gib_total"]:
            raise ConfigError(f"profile {name!r} needs {ranks} ranks of ~{sized['gib_per_gpu']:.1f} GiB and this "
                              f"machine has {m['gib_total']:.1f} GiB of memory: {hint}")
