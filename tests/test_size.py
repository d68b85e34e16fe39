"""Sizing before renting machines: the params.yaml profiles' parameters and memory per GPU; MT-NLG 530B
at tp 8 x pp 35 x dp 8 fits an 80 GB GPU."""
from __future__ import annotations

import json

import pytest
import yaml

from tasks.core.config import load_params
from tests.conftest import REPO
from trainer.config import ParallelParams
from trainer.size import main, model_of, parameters, report, size

PROFILES = load_params(REPO / "params.yaml").train.profiles


def gpt2_shaped_files(folder) -> tuple[str, str]:
    """A vocab.json + merges.txt of GPT-2's size: 256 byte symbols, 50,000 merges, <|endoftext|>."""
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pairs = [(a, b) for a in alphabet for b in alphabet][:50_000]
    vocab = {t: i for i, t in enumerate(alphabet + [a + b for a, b in pairs] + ["<|endoftext|>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in pairs))
    return str(folder / "vocab.json"), str(folder / "merges.txt")


def test_mtnlg_530b_is_530b_parameters_and_fits_an_80gb_gpu(capsys, tmp_path):
    recipe = PROFILES["mt-nlg-530b"]
    m = model_of(recipe)
    assert m.vocab_size == 51200 and m.seq_len == 2048  # 50257 padded to a multiple of 128 x tp 8
    assert parameters(m) == pytest.approx(530e9, rel=0.005)
    r = size(m, recipe.parallel)
    assert r["gpus"] == 2240 and 10 < r["total_gib"] < 80
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["paths"]["data_dir"] = str(tmp_path / "data")
    # no blend yet: sized with the vocabulary of the tokenizer file named (GPT-2's shape, as MT-NLG's)
    raw["tokenize"]["tokenizer_file"], raw["tokenize"]["merges_file"] = gpt2_shaped_files(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert main(["mt-nlg-530b", str(tmp_path / "params.yaml")]) == 0
    assert "529.6B parameters" in capsys.readouterr().out
    raw["tokenize"]["tokenizer_file"] = str(tmp_path / "missing.json")
    raw["tokenize"]["merges_file"] = ""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert main(["mt-nlg-530b", str(tmp_path / "params.yaml")]) == 2
    assert f"cannot load tokenizer from {tmp_path / 'missing.json'}" in capsys.readouterr().err


def test_mtnlg_recipe_is_the_papers():
    r = PROFILES["mt-nlg-530b"]
    assert (r.parallel.tp, r.parallel.pp, r.parallel.global_batch, r.parallel.recompute) == (8, 35, 1920, True)
    assert (r.optim.beta1, r.optim.beta2, r.optim.eps, r.optim.weight_decay, r.optim.grad_clip) == \
        (0.9, 0.95, 1e-8, 0.1, 1.0)
    s = r.schedule
    assert (s.train_tokens, s.warmup_tokens, s.rampup_start, s.rampup_increment, s.rampup_tokens) == \
        (270e9, 1e9, 32, 32, 12e9)


def test_gpt_350m_profile_is_gpt2_medium_sized():
    assert parameters(model_of(PROFILES["gpt-350m"])) == pytest.approx(355e6, rel=0.01)


def test_recomputation_trades_activation_memory():
    m = model_of(PROFILES["gpt-350m"])
    off = size(m, ParallelParams(micro_batch=8, global_batch=256))
    on = size(m, ParallelParams(micro_batch=8, global_batch=256, recompute=True))
    assert on["activations_gib"] < off["activations_gib"] / 5


def test_a_profile_whose_layout_cannot_work_is_named():
    bad = PROFILES["gpt-350m"].model_copy(update={"parallel": ParallelParams(tp=3, global_batch=4, micro_batch=1)})
    with pytest.raises(Exception, match="tp 3 does not divide n_head 16"):
        report("gpt-350m", bad)


def test_an_unknown_profile_is_a_usage_error(capsys):
    assert main(["gpt-9000", str(REPO / "params.yaml")]) == 2 and "usage" in capsys.readouterr().err


def test_fp32_weights_and_activations_take_twice_the_bytes_of_bf16():
    m = model_of(PROFILES["gpt-350m"])
    for recompute in (False, True):
        par = ParallelParams(micro_batch=8, global_batch=256, recompute=recompute)
        half, full = size(m, par, "bf16"), size(m, par, "fp32")
        n = half["parameters_per_gpu"]
        assert half["weights_and_grads_gib"] * 2**30 == pytest.approx(6 * n, rel=1e-6)  # 2 B weight + 4 B fp32 grad
        assert full["weights_and_grads_gib"] * 2**30 == pytest.approx(8 * n, rel=1e-6)  # 4 B + 4 B
        assert full["optimizer_gib"] == half["optimizer_gib"]  # fp32 master + moments either way
        assert full["activations_gib"] == pytest.approx(2 * half["activations_gib"])
        assert size(m, par, "fp16")["total_gib"] == half["total_gib"]


def test_the_cli_sizes_at_the_finished_blend_else_at_params(tmp_path, capsys):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["paths"]["data_dir"] = str(tmp_path / "data")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert main(["sample", str(tmp_path / "params.yaml")]) == 0
    out = capsys.readouterr().out
    seq, vocab = raw["tokenize"]["seq_length"], raw["tokenize"]["vocab_size"]
    assert f"vocabulary {vocab} and context length {seq} (params.yaml: no finished blend)" in out
    assert f"sequence {seq}, vocabulary 4096" in out  # 4096 padded for tp 1 (a multiple of 1024)
