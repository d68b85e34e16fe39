"""Sizing before renting machines: MT-NLG 530B's parameters and its memory per GPU at tp 8 x pp 35."""
from __future__ import annotations

import pytest

from trainer.size import PROFILES, main, model_of, parameters, size


def test_mtnlg_530b_is_530b_parameters_and_fits_an_80gb_gpu(capsys):
    profile = PROFILES["mt-nlg-530b"]
    m = model_of(profile)
    assert m.vocab_size == 51200  # 50257 padded to a multiple of 128 x tp 8
    assert parameters(m) == pytest.approx(530e9, rel=0.005)
    r = size(m, profile["parallel"])
    assert r["gpus"] == 2240 and 10 < r["total_gib"] < 80
    assert main(["mt-nlg-530b"]) == 0 and "529.6B parameters" in capsys.readouterr().out


def test_gpt_350m_profile_is_gpt2_medium_sized():
    assert parameters(model_of(PROFILES["gpt-350m"])) == pytest.approx(355e6, rel=0.01)


def test_an_unknown_profile_is_a_usage_error(capsys):
    assert main(["gpt-9000"]) == 2 and "usage" in capsys.readouterr().err
