"""The recipe's schedules as functions of the data position, so a resumed run (or one at another
layout) continues exactly: global batch from consumed samples (Megatron's --rampup-batch-size), learning
rate from consumed tokens (linear warmup, then cosine to min_lr_ratio of the peak, then flat)."""
from __future__ import annotations

import math

from tasks.core.errors import ConfigError
from trainer.config import OptimParams, ParallelParams, ScheduleParams


def check(s: ScheduleParams, par: ParallelParams) -> None:
    """The ramp must move in whole micro-batch x dp steps, or some steps could not be split evenly."""
    if not s.rampup_start:
        return
    unit = par.micro_batch * par.dp
    for name, value in (("rampup_start", s.rampup_start), ("rampup_increment", s.rampup_increment)):
        if value % unit:
            raise ConfigError(f"schedule.{name} {value} is not a multiple of micro_batch x dp = {unit}")
    if s.rampup_increment == 0 or s.rampup_start > par.global_batch:
        raise ConfigError(f"schedule: a ramp needs rampup_increment > 0 and rampup_start <= global_batch "
                          f"{par.global_batch}")
    if (par.global_batch - s.rampup_start) % s.rampup_increment:
        raise ConfigError(f"schedule: global_batch {par.global_batch} - rampup_start {s.rampup_start} is not "
                          f"a multiple of rampup_increment {s.rampup_increment}")


def global_batch(consumed_samples: int, s: ScheduleParams, par: ParallelParams, seq_len: int) -> int:
    """Megatron's ramp: start at rampup_start and add rampup_increment every equal share of the ramp's
    samples, reaching global_batch when rampup_tokens are consumed."""
    if not s.rampup_start or s.rampup_start == par.global_batch:
        return par.global_batch
    increments = (par.global_batch - s.rampup_start) // s.rampup_increment if s.rampup_increment else 0
    if increments <= 0:
        check(s, par)  # names what is wrong (a ramp that cannot reach global_batch in whole increments)
        raise ConfigError(f"schedule: rampup_start {s.rampup_start} + rampup_increment {s.rampup_increment} is past "
                          f"global_batch {par.global_batch}")
    per_increment = s.rampup_tokens / seq_len / increments
    done = int(consumed_samples / per_increment) if per_increment > 0 else increments
    return min(par.global_batch, s.rampup_start + done * s.rampup_increment)


def whole_batches(samples: int, s: ScheduleParams, par: ParallelParams, seq_len: int, start: int = 0) -> int:
    """How many of `samples` the steps consume, from `start` consumed on, when every step's batch must be
    whole (ramp included)."""
    consumed = start
    while consumed + (rows := global_batch(consumed, s, par, seq_len)) <= samples:
        consumed += rows
    return consumed


def within_data(s: ScheduleParams, par: ParallelParams, seq_len: int, samples: int, start: int = 0) -> ScheduleParams:
    """The schedule a run over `samples` trains to, from `start` consumed on. train_tokens 0: every whole
    batch left. A budget the data was built for (at least train_tokens // seq_len samples, what tokenize
    builds for the same budget) whose last batch would run past the data: the whole batches there are, the
    partial last one left out as Megatron leaves it, the learning rate still decaying over the budget.
    Otherwise as given: a budget the data cannot hold is refused before launching."""
    if s.train_tokens and (samples < s.train_tokens // seq_len or samples_needed(s, par, seq_len, start) <= samples):
        return s
    update = {"train_tokens": whole_batches(samples, s, par, seq_len, start) * seq_len}
    if s.train_tokens:
        update["decay_tokens"] = s.decay_tokens or s.train_tokens
    return s.model_copy(update=update)


def samples_needed(s: ScheduleParams, par: ParallelParams, seq_len: int, start: int = 0) -> int:
    """The samples the steps consume to reach `train_tokens` (ramp included), as the loop takes them, from
    `start` samples consumed on (a resumed run)."""
    samples, tokens = start, start * seq_len
    while tokens < s.train_tokens:
        rows = global_batch(samples, s, par, seq_len)
        samples, tokens = samples + rows, tokens + rows * seq_len
    return samples


def learning_rate(consumed_tokens: int, s: ScheduleParams, opt: OptimParams) -> float:
    if s.warmup_tokens and consumed_tokens < s.warmup_tokens:
        return opt.lr * consumed_tokens / s.warmup_tokens
    end = s.decay_tokens or s.train_tokens
    low = opt.lr * s.min_lr_ratio
    if end <= s.warmup_tokens:  # past a warmup as long as the run (a warning of the stage): its end, as Megatron
        return low if end else opt.lr
    progress = min(1.0, (consumed_tokens - s.warmup_tokens) / (end - s.warmup_tokens))
    return low + (opt.lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
