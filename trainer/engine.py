"""The 3D-parallel training engine: the pipeline of trainer/pipeline.py under DeepSpeed, with
ZeRO-1 data parallelism, AdamW and gradient clipping. Launch one process per rank with the
`deepspeed` launcher or torchrun; on CPU set DS_ACCELERATOR=cpu (gloo), on GPU it uses NCCL.

    engine = Engine.start(model_params, parallel_params, optim_params, seed=0)
    loss = engine.train_step(rows)      # rows: this replica's [global_batch / dp, seq + 1] tokens
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable

import torch
import torch.nn as nn

from tasks.core.errors import TrainingError
from trainer.config import ModelParams, OptimParams, ParallelParams, plan
from trainer.topology import coord, tensor_group


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (linear and embedding weights), none on biases and LayerNorm gains (Megatron)."""
    decay, plain = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else plain).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def init_distributed() -> None:
    """DeepSpeed's process group for this rank (its environment set by the launcher).

    On the CPU accelerator DeepSpeed also loads its shared-memory collective op, a torch C++ extension
    that only its inference_all_reduce uses, and loading it holds a lock file in the torch extensions
    folder (~/.cache/torch_extensions) while ninja checks or builds it. A start killed in that window
    (kill -9, Ctrl-C, a flow run cancelled from the UI) left the file behind, and every later training
    start on the machine waited on it forever. Training here uses gloo's collectives only, so CPU runs
    skip the op (the first start on a fresh machine no longer compiles it either)."""
    import importlib
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    if get_accelerator().device_name() == "cpu":
        # by module name: `deepspeed.comm.torch` as an attribute is the torch package that module imports
        torch_backend = importlib.import_module("deepspeed.comm.torch")
        torch_backend.build_shm_op = lambda: None  # TorchBackend.__init__ looks the name up when it runs
    deepspeed.init_distributed(verbose=False)


def zero_stage(par: ParallelParams, opt: OptimParams) -> int:
    """ZeRO-1 partitions the optimizer state over the data-parallel replicas; one replica has nothing
    to partition and its flat-buffer copies cost ~7% of a CPU step, so a single-stage dp = 1 fp32 run
    uses stage 0. ZeRO-1 stays with pp > 1 (DeepSpeed's stage-0 clipping counts the tied embedding's
    gradient on both stages; its ZeRO-1 norm skips the replica) and in half precision (the fp32 master
    weights and moments are then reached the same way as under dp > 1, for checkpoints). bf16 runs ZeRO-1
    whatever is asked: DeepSpeed accumulates bf16 gradients in fp32 only there (stage 0 stops at start)."""
    single = par.dp == 1 and par.pp == 1 and opt.dtype == "fp32"
    return 0 if single else 1 if opt.dtype == "bf16" else par.zero_stage


def deepspeed_config(par: ParallelParams, opt: OptimParams) -> dict:
    return {
        "train_batch_size": par.global_batch,
        "train_micro_batch_size_per_gpu": par.micro_batch,
        "gradient_accumulation_steps": par.micro_batches,
        # torch's AdamW: no JIT-built op (DeepSpeed's FusedAdam/CPUAdam take ~2 minutes to compile)
        "optimizer": {"type": "AdamW", "params": {"lr": opt.lr, "betas": [opt.beta1, opt.beta2], "eps": opt.eps,
                                                  "weight_decay": opt.weight_decay, "torch_adam": True}},
        "gradient_clipping": opt.grad_clip,  # DeepSpeed's default is 1.0 whatever the recipe says
        "zero_optimization": {"stage": zero_stage(par, opt)},
        # bf16 gradients summed over many micro-batches lose precision: accumulate them in fp32, and reduce
        # them over the replicas in fp32 (DeepSpeed's default communication dtype under bf16 is bf16, which
        # rounded the fp32 accumulators to bf16 before clipping and Adam, even at dp 1: Megatron forces fp32)
        **({"data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}
           if opt.dtype == "bf16" else {}),
        # each gradient goes to its fp32 accumulator as it is computed: without it DeepSpeed's bf16 optimizer
        # clears the last stage's gradients once its backward has begun, after the tied head's was computed,
        # and at pp > 1 the word embedding trained on the first stage's lookup gradient alone
        "bf16": {"enabled": opt.dtype == "bf16", "immediate_grad_update": True},
        # dynamic loss scaling from 2^16, halved on overflow (the step skipped), doubled after 1000 clean steps
        "fp16": {"enabled": opt.dtype == "fp16", "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


class Engine:
    """One rank's view of a training run: its pipeline stage and the DeepSpeed engine around it."""

    def __init__(self, ds_engine, model: ModelParams, par: ParallelParams, notes: list[str], group=None):
        self.ds, self.model, self.par, self.notes = ds_engine, model, par, notes
        self.tensor_group = group
        self.rank = int(os.environ["RANK"])
        self.coord = coord(self.rank, par)

    @classmethod
    def start(cls, model: ModelParams, par: ParallelParams, opt: OptimParams, seed: int = 0) -> "Engine":
        """Check the layout (before any process group), join the process group, build this rank's
        stage with the layout-independent initialisation for `seed`, and wrap it in DeepSpeed."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        model, notes = plan(model, par, world)
        stage = zero_stage(par, opt)
        if stage != par.zero_stage:
            notes.append(f"zero_stage {par.zero_stage} runs as 0 at dp 1, pp 1 (one replica: nothing to partition)"
                         if stage == 0 else
                         f"zero_stage {par.zero_stage} runs as 1 in bf16 (DeepSpeed accumulates bf16 gradients in "
                         f"fp32 only under ZeRO)")
        if int(os.environ.get("RANK", "0")) == 0:
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
        import warnings
        # DeepSpeed's pipeline sends activations with in-place broadcasts that torch warns about on
        # every backward; its gradients are passed explicitly, so the warning says nothing here
        warnings.filterwarnings("ignore", message="c10d::broadcast_: an autograd kernel was not registered")
        import deepspeed
        from trainer.pipeline import build_pipeline
        init_distributed()
        group = tensor_group(par)
        pipe = build_pipeline(model, par, group, seed)
        ds_engine, *_ = deepspeed.initialize(model=pipe, model_parameters=param_groups(pipe, opt.weight_decay),
                                             config=deepspeed_config(par, opt))
        return cls(ds_engine, model, par, notes, group)

    @property
    def device(self) -> torch.device:
        return self.ds.device

    def replica_rows(self, batch: torch.Tensor) -> torch.Tensor:
        """This replica's contiguous share of a global batch [rows, seq + 1]."""
        per = batch.shape[0] // self.par.dp
        return batch[self.coord.data * per:(self.coord.data + 1) * per]

    def set_global_batch(self, rows: int) -> None:
        """Batch-size ramp: the same micro-batch, more or fewer micro-batches per step (as Megatron)."""
        if rows != self.ds.train_batch_size():
            self.ds.set_train_batch_size(rows)

    def set_lr(self, lr: float) -> None:
        for group in self.ds.optimizer.param_groups:
            group["lr"] = lr

    def train_step(self, rows: torch.Tensor) -> float:
        """One optimizer step over this replica's rows: its micro-batches through the 1F1B schedule,
        gradients averaged over dp and summed for the tied embedding, clipped, AdamW. Returns the
        step's mean loss over the whole global batch (the same number on every rank)."""
        micro: Iterable = ((mb[:, :-1].contiguous(), mb[:, 1:].contiguous())
                           for mb in rows.split(self.par.micro_batch))
        try:
            return float(self.ds.train_batch(data_iter=iter(micro)))
        except Exception as e:  # DeepSpeed's fp16 scaler stops the run where Megatron's would skip on forever
            if "loss scale already at minimum" not in str(e):
                raise
            raise TrainingError("fp16 loss scale is at its minimum (min_loss_scale 1) and the step still overflows: "
                                "the gradients are not finite at any scale (lower the learning rate, or bf16)") from None

    def grad_norm(self) -> float | None:
        """The last step's global gradient norm before clipping, as DeepSpeed's optimizer computed it
        (ZeRO-1 and half precision; None under stage-0 fp32, whose clipping keeps no norm)."""
        norm = self.ds.get_global_grad_norm()
        return None if norm is None else float(norm)

    def close(self) -> None:
        """Leave the process group together: a rank exiting while gloo's threads still talk to its
        peers can abort ("terminate called without an active exception")."""
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
