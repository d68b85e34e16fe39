"""Export a checkpoint to Hugging Face format (GPT-2 architecture): config.json, model.safetensors and,
with the tokenizer, tokenizer.json, tokenizer_config.json and generation_config.json, loadable by `transformers.GPT2LMHeadModel.from_pretrained` and so by
lm-evaluation-harness, vLLM and the rest. The checkpoint is layout-independent, so any one exports.

    python -m trainer.export <checkpoint folder> <out folder> [--tokenizer tokenizer.json]

GPT-2 is the same network (pre-LayerNorm, learned positions, tanh GeLU = "gelu_new", tied head); two
layouts differ: its Conv1D weights are [in, out] (ours [out, in], as nn.Linear) and its fused qkv is
[q | k | v] across all heads where ours is head by head (so a tensor-parallel split keeps heads whole).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainer.checkpoint import Tensors, read_meta
from trainer.config import ModelParams


def hf_config(p: ModelParams, eod: int | None = None) -> dict:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": p.vocab_size,
            "n_positions": p.seq_len, "n_embd": p.d_model, "n_layer": p.n_layer, "n_head": p.n_head,
            "n_inner": 4 * p.d_model, "activation_function": "gelu_new", "layer_norm_epsilon": p.layernorm_eps,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": p.std,
            "scale_attn_weights": True, "tie_word_embeddings": True, "use_cache": True,
            "bos_token_id": eod, "eos_token_id": eod, "torch_dtype": "float32"}


def hf_tokenizer_files(p: ModelParams, eod: int, ids: int) -> dict[str, dict]:
    """generation_config.json and tokenizer_config.json for `ids` real token ids. The embedding keeps the
    rows past them that pad the vocabulary for tensor parallelism (the logits stay the model's): sampling
    suppresses them, as the project's generator and Megatron's sampler leave them out (transformers drew
    19% of its tokens there, ids the tokenizer has not). model_max_length: a longer prompt was an IndexError."""
    return {"generation_config.json": {"bos_token_id": eod, "eos_token_id": eod, "pad_token_id": eod,
                                       "suppress_tokens": list(range(ids, p.vocab_size))},
            "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": p.seq_len,
                                      "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                      "unk_token": "<|endoftext|>"}}


def _qkv_to_gpt2(t: torch.Tensor, p: ModelParams) -> torch.Tensor:
    """Our [head][q|k|v][head_dim] output rows -> GPT-2's [q|k|v][head][head_dim]."""
    hd = p.d_model // p.n_head
    return t.reshape(p.n_head, 3, hd, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _qkv_from_gpt2(t: torch.Tensor, p: ModelParams) -> torch.Tensor:
    """GPT-2's [q|k|v][head][head_dim] rows -> ours, [head][q|k|v][head_dim]."""
    hd = p.d_model // p.n_head
    return t.reshape(3, p.n_head, hd, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def gpt2_state(get, p: ModelParams) -> dict[str, torch.Tensor]:
    """GPT-2 tensors from ours; `get(name)` returns our whole fp32 tensor by its plain-GPT name."""
    out = {"transformer.wte.weight": get("wte.weight"), "transformer.wpe.weight": get("wpe.weight"),
           "transformer.ln_f.weight": get("ln_f.weight"), "transformer.ln_f.bias": get("ln_f.bias")}
    for i in range(p.n_layer):
        ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{theirs}{b}.weight"], out[f"{theirs}{b}.bias"] = get(f"{ours}{a}.weight"), get(f"{ours}{a}.bias")
        out[f"{theirs}attn.c_attn.weight"] = _qkv_to_gpt2(get(f"{ours}attn.qkv.weight"), p).t()
        out[f"{theirs}attn.c_attn.bias"] = _qkv_to_gpt2(get(f"{ours}attn.qkv.bias"), p)
        for a, b in (("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            out[f"{theirs}{b}.weight"] = get(f"{ours}{a}.weight").t()
            out[f"{theirs}{b}.bias"] = get(f"{ours}{a}.bias")
    return {k: v.float().contiguous() for k, v in out.items()}


def state_from_gpt2(get, p: ModelParams) -> dict[str, torch.Tensor]:
    """The inverse of gpt2_state: our plain-GPT tensors from a GPT-2 model's (`get(GPT-2 name)`)."""
    out = {"wte.weight": get("transformer.wte.weight"), "wpe.weight": get("transformer.wpe.weight"),
           "ln_f.weight": get("transformer.ln_f.weight"), "ln_f.bias": get("transformer.ln_f.bias")}
    for i in range(p.n_layer):
        ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{ours}{a}.weight"], out[f"{ours}{a}.bias"] = get(f"{theirs}{b}.weight"), get(f"{theirs}{b}.bias")
        out[f"{ours}attn.qkv.weight"] = _qkv_from_gpt2(get(f"{theirs}attn.c_attn.weight").t(), p)
        out[f"{ours}attn.qkv.bias"] = _qkv_from_gpt2(get(f"{theirs}attn.c_attn.bias"), p)
        for a, b in (("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            out[f"{ours}{a}.weight"] = get(f"{theirs}{b}.weight").t()
            out[f"{ours}{a}.bias"] = get(f"{theirs}{b}.bias")
    return {k: v.float().contiguous() for k, v in out.items()}


def export(checkpoint: Path, out: Path, tokenizer: Path | None = None) -> Path:
    if not (Path(checkpoint) / "meta.json").is_file():  # a typo, or a Hugging Face folder (exported already)
        from tasks.core.errors import InputFileError
        what = "no such folder" if not Path(checkpoint).exists() else "not a checkpoint (no meta.json)" + (
            ": a Hugging Face model, exported already" if (Path(checkpoint) / "config.json").is_file() else "")
        raise InputFileError(f"{checkpoint}: {what}")
    meta = read_meta(checkpoint)
    p = ModelParams(**meta["model"])
    tensors = Tensors(checkpoint)
    state = gpt2_state(lambda name: tensors[f"param/{name}"], p)
    out = Path(out).resolve()  # `.` has no name to put the temporary folder beside
    eod, extra = None, {}  # without a tokenizer, no end-of-text id (0 stopped generation at the wrong token)
    if tokenizer is not None:  # GPT-2 style: <|endoftext|> is both BOS and EOS; a bad file fails before any write
        from tasks.tokenize import tokenizer as tokenizers
        tok = tokenizers.load(tokenizer)
        eod = tokenizers.eod_id(tok)
        extra = hf_tokenizer_files(p, eod, tokenizers.id_bound(tok))
    # written beside `out`, then moved in file by file: a failed export leaves no weights without a config
    out.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            shutil.copyfile(tokenizer, tmp / "tokenizer.json")
        for name, content in extra.items():
            (tmp / name).write_text(json.dumps(content, indent=1), encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(hf_config(p, eod), indent=1), encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        written = {f.name for f in tmp.iterdir()}
        for stale in ({"tokenizer.json", "tokenizer_config.json", "generation_config.json"} - written):
            (out / stale).unlink(missing_ok=True)  # an earlier export's, with another end-of-text id
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):  # the config last
            f.chmod(0o666 & ~umask)  # as any file written here (safetensors makes its file 0600)
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    from tasks.core.errors import describe
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        print(export(args.checkpoint, args.out, args.tokenizer))
    except Exception as e:  # noqa: BLE001
        code, line = describe(e)
        print(line, file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
