"""The recipe's schedules (MT-NLG's numbers): LR warmup then cosine to 10%, Megatron's batch ramp."""
from __future__ import annotations

import pytest

from tasks.core.errors import ConfigError
from trainer import schedule
from trainer.config import OptimParams, ParallelParams, ScheduleParams

SEQ = 2048
MTNLG = ScheduleParams(train_tokens=270 * 10**9, warmup_tokens=10**9, rampup_start=32, rampup_increment=32,
                       rampup_tokens=12 * 10**9)
PAR = ParallelParams(tp=8, pp=35, dp=8, micro_batch=1, global_batch=1920)  # 2240 GPUs
OPT = OptimParams(lr=5e-5)


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    lr = lambda tokens: schedule.learning_rate(tokens, MTNLG, OPT)  # noqa: E731
    assert lr(0) == 0.0
    assert lr(5 * 10**8) == pytest.approx(2.5e-5)
    assert lr(10**9) == pytest.approx(5e-5)
    assert lr(10**9 + (270 * 10**9 - 10**9) // 2) == pytest.approx((5e-5 + 5e-6) / 2)
    assert lr(270 * 10**9) == pytest.approx(5e-6)
    assert lr(400 * 10**9) == pytest.approx(5e-6), "flat at the floor after the decay"
    values = [lr(t) for t in range(10**9, 270 * 10**9, 10**9)]
    assert all(a >= b for a, b in zip(values, values[1:])), "monotone decay"


def test_batch_ramps_from_32_by_32_to_1920_over_12b_tokens_like_megatron():
    gb = lambda samples: schedule.global_batch(samples, MTNLG, PAR, SEQ)  # noqa: E731
    per_increment = 12 * 10**9 / SEQ / 59  # 59 increments of 32 from 32 to 1920
    assert gb(0) == 32
    assert gb(int(per_increment) - 1) == 32 and gb(int(per_increment) + 1) == 64
    assert gb(int(30 * per_increment) + 1) == 32 + 30 * 32
    assert gb(12 * 10**9 // SEQ) == 1920 and gb(10**9) == 1920
    assert schedule.global_batch(0, ScheduleParams(train_tokens=1), PAR, SEQ) == 1920, "no ramp"


@pytest.mark.parametrize("ramp,message", [
    (dict(rampup_start=30, rampup_increment=32), "rampup_start 30 is not a multiple of micro_batch x dp = 8"),
    (dict(rampup_start=40, rampup_increment=0), "a ramp needs rampup_increment > 0"),
    (dict(rampup_start=48, rampup_increment=40), "global_batch 1920 - rampup_start 48 is not a multiple of "
                                                 "rampup_increment 40"),
])
def test_a_ramp_that_cannot_be_split_is_refused(ramp, message):
    with pytest.raises(ConfigError, match=message):
        schedule.check(ScheduleParams(train_tokens=1, rampup_tokens=10, **ramp), PAR)


def test_the_mtnlg_ramp_is_accepted():
    schedule.check(MTNLG, PAR)


def test_whole_batches_stop_before_a_partial_one():
    par = ParallelParams(micro_batch=2, global_batch=8)
    assert schedule.whole_batches(1562, ScheduleParams(), par, 128) == 1560
    ramp = ScheduleParams(rampup_start=2, rampup_increment=2, rampup_tokens=8 * 16)  # 8 samples of 16 tokens
    # +2 every 8/3 samples consumed: batches 2, 2, 4, 8, 8 = 24; the next 8 would pass 30
    assert schedule.whole_batches(30, ramp, par, 16) == 24


def test_a_decay_that_ends_before_the_warmup_is_refused_and_the_rate_ends_at_its_floor():
    """Reviewed against Megatron (it asserts lr_warmup_steps < lr_decay_steps, and gives min_lr past the decay):
    here such a schedule trained at its peak for good, and one more decay token made a 10x jump."""
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="decay_tokens 1000 must be more than warmup_tokens 1000"):
        ScheduleParams(warmup_tokens=1000, decay_tokens=1000)
    # a resolved budget no longer than the warmup (train_tokens 0 on a small blend; the stage warns of it)
    short = ScheduleParams(train_tokens=800, warmup_tokens=1000)
    assert [schedule.learning_rate(t, short, OPT) for t in (500, 999, 1000, 5000)] == \
        pytest.approx([2.5e-5, 5e-5 * 0.999, 5e-6, 5e-6])


def test_a_ramp_past_its_batch_is_a_configuration_error_not_a_division_by_zero():
    par = ParallelParams(micro_batch=2, global_batch=8)
    for ramp in (ScheduleParams(rampup_start=2, rampup_increment=0, rampup_tokens=64),
                 ScheduleParams(rampup_start=4, rampup_increment=8, rampup_tokens=64)):
        with pytest.raises(ConfigError, match="schedule: "):
            schedule.global_batch(0, ramp, par, 16)
