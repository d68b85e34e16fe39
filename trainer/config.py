"""The trainer's typed configuration (sections of params.yaml once the train stage lands): the model,
its parallel layout and the optimizer; `plan` checks a layout before any process group starts."""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.core.errors import ConfigError
from tasks.core.strict import PathText, Strict


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary padded so every tensor-parallel rank holds an equal slice whose size is a multiple
    of 128 (Megatron pads to 128 x tp). Here to a multiple of lcm(1024, 128 x tp): the same size for
    every tp up to 8 (50257 -> 51200, MT-NLG's), so a checkpoint resumes and exports the same at any
    of them; a tp that does not divide 1024 (3, 6, 12, ...) gives a larger size of its own."""
    step = math.lcm(1024, 128 * tp)
    return -(-vocab // step) * step


class ArchParams(Strict):
    """The network's shape, as the train stage's params.yaml section gives it (the context length and
    the vocabulary come from the blend and its tokenizer, so they are stated once, in `tokenize`)."""

    n_layer: int = Field(24, ge=1, description="Transformer blocks.")
    n_head: int = Field(16, ge=1, description="Attention heads.")
    d_model: int = Field(1024, ge=1, description="Hidden size.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on embeddings, attention output and MLP output.")
    init_std: float | None = Field(None, gt=0.0, description=(
        "Weight init std; None: sqrt(1/(3*d_model)), the rule of Megatron-DeepSpeed's MT-NLG scripts "
        "(4.03e-3 at d_model 20480; the paper's is 4.0e-3)."))
    layernorm_eps: float = Field(1e-5, gt=0.0, description="LayerNorm's epsilon.")
    attention: Literal["sdpa", "softmax"] = Field(
        "sdpa", description="sdpa: scaled_dot_product_attention (flash on GPU); softmax: explicit scores "
                            "through the scaled causal softmax (fused kernel when enabled).")
    fused_kernels: bool = Field(True, description="Use kernels/ CuPy kernels when a GPU and CuPy are present.")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.d_model % self.n_head:
            raise ValueError(f"n_head {self.n_head} does not divide d_model {self.d_model}")
        return self


# how the same model is computed, not which model: a run resumes across a change of them (checkpoint.check_model)
HOW_COMPUTED = ("fused_kernels", "attention")


def recipe_model(model: "ModelParams") -> "ModelParams":
    """`model` with HOW_COMPUTED at their defaults, as a run's identity digests it: turning the fused kernels
    off (the stage's advice when they cannot run) started the run again from step 0. At the defaults, not
    left out: the identity of a run that never set them is the one it had."""
    return model.model_copy(update={k: type(model).model_fields[k].default for k in HOW_COMPUTED})


class ModelParams(ArchParams):
    """A GPT decoder as MT-NLG and GPT-3: pre-LayerNorm, learned positions, GeLU (tanh), tied embeddings."""

    vocab_size: int = Field(51200, ge=2, description="Vocabulary, padded (padded_vocab: 50257 -> 51200).")
    seq_len: int = Field(2048, ge=1, description="Context length (learned position embeddings).")

    @property
    def std(self) -> float:
        return self.init_std if self.init_std is not None else math.sqrt(1.0 / (3 * self.d_model))


class ParallelParams(Strict):
    """The 3D layout (MT-NLG: tp 8 inside a node, pp 35 across nodes, dp outermost) and the batch."""

    tp: int = Field(1, ge=1, description="Tensor-parallel ranks (adjacent ranks: inside a node).")
    pp: int = Field(1, ge=1, description="Pipeline stages (across nodes).")
    dp: int = Field(1, ge=1, description="Data-parallel replicas (outermost).")
    micro_batch: int = Field(4, ge=1, description="Sequences per micro-batch on one data-parallel replica.")
    global_batch: int = Field(16, ge=1, description="Sequences per optimizer step (MT-NLG: 1920).")
    zero_stage: Literal[0, 1] = Field(1, description="ZeRO stage: 1 partitions the optimizer state over dp "
                                                     "(DeepSpeed pipelines allow 0 or 1).")
    partition: Literal["parameters", "uniform", "blocks"] = Field(
        "parameters", description="How layers are split into stages: evenly by parameter count, by layer count, or "
                                  "by transformer blocks (Megatron-DeepSpeed's; the embeddings go with the end stages).")
    recompute: bool = Field(False, description="Activation checkpointing: keep each layer's input only and "
                                               "recompute the layer in backward (DeepSpeed's, every layer).")

    @field_validator("zero_stage", mode="before")
    @classmethod
    def _a_stage_is_a_number(cls, v):
        if isinstance(v, bool):  # a Literal of ints takes True as 1: YAML's `off` turned ZeRO-1 off
            raise ValueError("the ZeRO stage is 0 or 1, not a yes/no")
        return v

    @model_validator(mode="after")
    def _clipping_counts_each_parameter_once(self):
        # DeepSpeed's stage-0 clipping counts the tied embedding's gradient on both end stages and leaves
        # out the later stages' replicated ones (+2.3% on a 2-stage model); its ZeRO-1 norm counts each once
        if self.zero_stage == 0 and self.pp > 1:
            raise ValueError("zero_stage 0 with pp > 1 clips by a wrong gradient norm in DeepSpeed "
                             "(the tied embedding counted twice): use zero_stage 1")
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step on each replica (DeepSpeed's gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)


class OptimParams(Strict):
    """AdamW as MT-NLG: betas (0.9, 0.95), weight decay 0.1 (not on biases and LayerNorm), clipping 1.0."""

    lr: float = Field(3e-4, gt=0.0, description="Peak learning rate (after warmup).")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="Adam's beta1.")
    beta2: float = Field(0.95, ge=0.0, lt=1.0, description="Adam's beta2.")
    eps: float = Field(1e-8, gt=0.0, description="Adam's epsilon.")
    weight_decay: float = Field(0.1, ge=0.0, description="AdamW's decoupled weight decay.")
    grad_clip: float = Field(1.0, ge=0.0, description="Global gradient-norm clip (0: off).")
    dtype: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16/fp16: half-precision weights and activations, fp32 master weights and optimizer "
                            "state; fp16 with dynamic loss scaling (an overflowing step is skipped).")


def layout_problem(model: ArchParams, par: ParallelParams) -> str | None:
    """Why the layout cannot split this network or its batch; None when it can."""
    if model.n_head % par.tp:
        return f"tp {par.tp} does not divide n_head {model.n_head}"
    if par.pp > model.n_layer:
        return f"pp {par.pp} is larger than n_layer {model.n_layer}: a stage would hold no block"
    if par.global_batch % (par.micro_batch * par.dp):
        return (f"global_batch {par.global_batch} is not divisible by micro_batch x dp = "
                f"{par.micro_batch} x {par.dp} = {par.micro_batch * par.dp}")
    return None


def plan(model: ModelParams, par: ParallelParams, world_size: int) -> tuple[ModelParams, list[str]]:
    """Check a layout before any process group starts: one ConfigError naming the cause. Returns the
    model with its vocabulary padded (padded_vocab: the same size for every tp up to 8), and notes saying so."""
    if world_size != par.world_size:
        raise ConfigError(f"world size {world_size} is not tp x pp x dp = {par.tp} x {par.pp} x {par.dp} "
                          f"= {par.world_size}")
    if why := layout_problem(model, par):
        raise ConfigError(why)
    from trainer.pipeline import one_group_stage
    padded = padded_vocab(model.vocab_size, par.tp)
    if why := one_group_stage(model.model_copy(update={"vocab_size": padded}), par):
        raise ConfigError(why)
    if padded == model.vocab_size:
        return model, []
    return (model.model_copy(update={"vocab_size": padded}),
            [f"vocab_size {model.vocab_size} padded to {padded} (equal slices of a multiple of 128 for tp {par.tp}, "
             f"the same size for every tp up to 8); "
             f"the {padded - model.vocab_size} extra rows are never a target"])


class ScheduleParams(Strict):
    """Tokens to train, the learning-rate schedule and the batch-size ramp, in tokens as MT-NLG states
    them (270B tokens, 1B of warmup, batch 32 -> 1920 in steps of 32 over the first 12B)."""

    train_tokens: int = Field(0, ge=0, description="Training stops once this many tokens are consumed "
                                                   "(0: every sample of the data once).")
    warmup_tokens: int = Field(0, ge=0, description="Linear LR warmup from 0 to the peak over these tokens.")
    decay_tokens: int | None = Field(None, ge=1, description="Cosine decay ends here (None: train_tokens).")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="Cosine decays to this fraction of the peak.")
    rampup_start: int = Field(0, ge=0, description="Global batch at the start of the ramp (0: no ramp).")
    rampup_increment: int = Field(0, ge=0, description="The ramp's step in sequences (Megatron's --rampup-batch-size).")
    rampup_tokens: int = Field(0, ge=0, description="Tokens over which the batch ramps up to global_batch.")

    @model_validator(mode="after")
    def _decay_ends_after_warmup(self):
        # Megatron asserts it (lr_warmup_steps < lr_decay_steps): here the rate stayed at its peak for good
        if self.decay_tokens is not None and self.decay_tokens <= self.warmup_tokens:
            raise ValueError(f"decay_tokens {self.decay_tokens} must be more than warmup_tokens {self.warmup_tokens}")
        return self


class RunSettings(Strict):
    """What a run sets besides its recipe: the seed, checkpoints and the MFU peak."""

    seed: int = Field(1234, ge=0, lt=2**32, description="Initialisation seed (the same model at every layout).")
    checkpoint_every: int = Field(100, ge=1, description="Steps between checkpoints (and one at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Most recent checkpoints kept on disk.")
    peak_tflops: float | None = Field(None, gt=0.0, description="Per-device dense peak for MFU (H100/H200 "
                                                                "SXM bf16: 989); None: MFU not reported.")


class TrainParams(RunSettings):
    """One training run: model, layout, optimizer, schedule, checkpoints."""

    model: ModelParams = ModelParams()
    parallel: ParallelParams = ParallelParams()
    optim: OptimParams = OptimParams()
    schedule: ScheduleParams = ScheduleParams()


class Recipe(Strict):
    """One named training profile of params.yaml `train.profiles`: the network's shape, its layout,
    the optimizer and the schedule (the context length and vocabulary come from the blend)."""

    model: ArchParams = Field(ArchParams(n_layer=2, n_head=4, d_model=64), description="The network's shape.")
    parallel: ParallelParams = Field(ParallelParams(pp=2, micro_batch=4, global_batch=8),
                                     description="Tensor x pipeline x data parallel layout and the batch.")
    optim: OptimParams = Field(OptimParams(), description="AdamW and gradient clipping.")
    schedule: ScheduleParams = Field(ScheduleParams(), description="Tokens, warmup, decay and the batch ramp.")
    seq_len: int | None = Field(None, ge=1, description="The context length the profile is made for (MT-NLG: "
                                                        "2048); None: the blend's. A blend of another is refused.")

    @model_validator(mode="after")
    def _layout_and_ramp_fit(self):
        # what needs no data is refused as params.yaml is read: it was refused only as train started, after
        # every data stage had run (hours, at scale); the blend's own limits are checked when train starts
        from trainer.schedule import check
        if why := layout_problem(self.model, self.parallel):
            raise ValueError(why)
        try:
            check(self.schedule, self.parallel)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self


class LaunchParams(Strict):
    """How the ranks start: torchrun on this machine, or DeepSpeed's launcher on the hosts of a hostfile
    (pdsh over ssh from the first host, as Megatron-DeepSpeed runs MT-NLG)."""

    hostfile: PathText | None = Field(None, description="DeepSpeed's hostfile, a `<host> slots=<ranks>` line per node; "
                                                   "the slots must add up to tp x pp x dp. None: torchrun here.")
    master_addr: str | None = Field(None, description="The first host's address as the others reach it "
                                                      "(None: 127.0.0.1, one host only).")
    master_port: int | None = Field(None, ge=1, le=65535, description="None: a free port of this machine (torchrun's "
                                    "standalone rendezvous binds one itself where neither it nor master_addr is set).")
    timeout_s: float | None = Field(None, gt=0, description="Every rank is killed after this long (None: no limit).")


class TrainStageParams(RunSettings):
    """params.yaml `train`: the profile `profile` of `profiles` trained on the `tokenize` stage's blend.
    Every profile is validated and sized in the stage's report; only the chosen one runs."""

    input_stage: Literal["tokenize"] = Field("tokenize", description="Stage whose blend is trained on.")
    profile: str = Field("sample", description="The profile of `profiles` that runs.")
    profiles: dict[str, Recipe] = Field(default_factory=lambda: {"sample": Recipe()},
                                        description="Named recipes: the tiny CPU `sample`, a GPU one, MT-NLG 530B.")
    launch: LaunchParams = Field(LaunchParams(),
                                 description="How ranks are started: locally, or on the hosts of a hostfile.")

    @model_validator(mode="after")
    def _profile_exists(self):
        if self.profile not in self.profiles:
            raise ValueError(f"profile {self.profile!r} is not one of profiles {sorted(self.profiles)}")
        return self

    @property
    def recipe(self) -> Recipe:
        return self.profiles[self.profile]

    def for_data(self, seq_len: int, vocab_size: int) -> TrainParams:
        """The trainer's parameters for the chosen profile once the blend's context length and
        vocabulary are known (a profile made for another context length is refused)."""
        r = self.recipe
        if r.seq_len is not None and r.seq_len != seq_len:
            raise ConfigError(f"profile {self.profile!r} is for seq_len {r.seq_len} but the blend's samples hold "
                              f"{seq_len} tokens (params tokenize.seq_length)")
        settings = {k: getattr(self, k) for k in RunSettings.model_fields}
        return TrainParams(model=ModelParams(**r.model.model_dump(), seq_len=seq_len, vocab_size=vocab_size),
                           parallel=r.parallel, optim=r.optim, schedule=r.schedule, **settings)
