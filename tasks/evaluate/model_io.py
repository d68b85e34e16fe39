"""The model to evaluate, on one process: a trainer checkpoint of any (tp, pp) layout (checkpoints are
layout-independent) or a Hugging Face GPT-2-format folder (config.json + model.safetensors), and the
tokenizer that goes with it. A tokenizer that cannot be the model's is refused, naming the mismatch."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from tasks.core.errors import ConfigError, InputFileError
from tasks.tokenize import tokenizer as tokenizers
from trainer import checkpoint as ckpt
from trainer.config import ModelParams, padded_vocab
from trainer.export import state_from_gpt2
from trainer.model import GPT


@dataclass
class LoadedModel:
    model: GPT
    tokenizer: Tokenizer
    eod: int               # <|endoftext|>: the context of an empty-context request (lm-eval's prefix token)
    source: str            # "checkpoint" | "hf"
    step: int | None       # the checkpoint's optimizer step (None for a Hugging Face folder)
    tokens: int | None     # training tokens seen at that step
    run: str | None = None  # the training run's identity a checkpoint records (meta.json's `run`)

    @property
    def params(self) -> ModelParams:
        return self.model.p


def _build(p: ModelParams, get) -> GPT:
    """The plain GPT with every parameter from `get(plain name)`, shapes checked."""
    model = GPT(p.model_copy(update={"dropout": 0.0, "fused_kernels": False}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            t = get(name)
            if tuple(t.shape) != tuple(param.shape):
                raise ConfigError(f"tensor {name}: shape {tuple(t.shape)} in the file, {tuple(param.shape)} in the model")
            param.copy_(t)
    return model.eval()


def params_from_hf(config: dict, where: Path) -> ModelParams:
    if config.get("model_type") != "gpt2":
        raise ConfigError(f"{where}: model_type {config.get('model_type')!r}; only GPT-2-format models are supported")
    act = config.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConfigError(f"{where}: activation_function {act!r}; the model uses the tanh GeLU (gelu_new)")
    unsupported = {"tie_word_embeddings": True, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                   "reorder_and_upcast_attn": False}
    for key, want in unsupported.items():
        if config.get(key, want) != want:
            raise ConfigError(f"{where}: {key}={config[key]!r} is another network than this GPT (needs {want})")
    inner = config.get("n_inner") or 4 * config["n_embd"]
    if inner != 4 * config["n_embd"]:
        raise ConfigError(f"{where}: n_inner {inner} != 4 x n_embd {config['n_embd']}")
    return ModelParams(n_layer=config["n_layer"], n_head=config["n_head"], d_model=config["n_embd"],
                       vocab_size=config["vocab_size"], seq_len=config["n_positions"],
                       layernorm_eps=config.get("layer_norm_epsilon", 1e-5), init_std=config.get("initializer_range"),
                       fused_kernels=False)


def _hf_tokenizer(folder: Path) -> Tokenizer:
    if (folder / "tokenizer.json").is_file():
        return tokenizers.load(folder / "tokenizer.json")
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return tokenizers.load(folder / "vocab.json", folder / "merges.txt")
    raise InputFileError(f"{folder}: no tokenizer (tokenizer.json, or vocab.json + merges.txt): give one with "
                         f"--tokenizer")


def _check_tokenizer(tok: Tokenizer, p: ModelParams, where: Path, exact_padding: int | None) -> int:
    """The tokenizer fits the model: its vocabulary is what the model was built for (a checkpoint: the
    tokenizer's size padded as the trainer pads it; a Hugging Face model: no token past the embedding)."""
    n = tokenizers.id_bound(tok)  # the largest id + 1, as tokenize reports the vocabulary
    if exact_padding is not None and padded_vocab(n, exact_padding) != p.vocab_size:
        raise ConfigError(f"tokenizer does not match the model {where}: {n} tokens pad to "
                          f"{padded_vocab(n, exact_padding)}, the model's vocabulary is {p.vocab_size}")
    if n > p.vocab_size:
        raise ConfigError(f"tokenizer does not match the model {where}: {n} tokens, the model embeds {p.vocab_size}")
    return tokenizers.eod_id(tok)


class CheckpointMismatch(ConfigError):
    """A checkpoint whose tokenizer or tensors do not fit its model: the scheduled evaluation reports it and goes on
    with the others (a mismatch stopped its every pass at that checkpoint, and the UI's history with it)."""


def load_checkpoint(folder: Path, tokenizer: Path) -> LoadedModel:
    folder = Path(folder)
    if not (folder / "meta.json").is_file():
        raise InputFileError(f"{folder}: not a checkpoint (no meta.json)")
    meta = ckpt.read_meta(folder)
    try:
        p = ModelParams(**meta["model"])
    except (TypeError, ValueError) as e:  # a pydantic error named no checkpoint
        raise ckpt.CheckpointUnreadable(f"{folder / 'meta.json'}: its model is not one this code builds "
                                        f"({str(e).splitlines()[0]}): the checkpoint {folder.name} is damaged") from None
    tensors = ckpt.Tensors(folder)
    tok = tokenizers.load(Path(tokenizer))
    try:
        eod = _check_tokenizer(tok, p, folder, meta.get("layout", {}).get("tp", 1))
        model = _build(p, lambda name: tensors[f"param/{name}"])
    except ConfigError as e:
        raise CheckpointMismatch(str(e)) from None
    return LoadedModel(model, tok, eod, "checkpoint", int(meta["step"]), meta.get("consumed_tokens"),
                       meta.get("run") or None)


def load_hf(folder: Path, tokenizer: Path | None = None) -> LoadedModel:
    """A Hugging Face GPT-2 folder, with its own tokenizer or `tokenizer` (given, it is the one used: an export
    written without --tokenizer has none, and the one passed to `tasks.evaluate.run` was ignored)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise InputFileError(f"{folder}: not a Hugging Face model folder (no config.json)")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    p = params_from_hf(config, folder)
    path = folder / "model.safetensors"
    if not path.is_file():
        raise InputFileError(f"{folder}: no model.safetensors (weights are read from safetensors only: no pickle)")
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())

        def get(name: str) -> torch.Tensor:  # GPT-2 files name tensors with or without "transformer."
            k = name if name in keys else name.removeprefix("transformer.")
            if k not in keys:
                raise ConfigError(f"{path}: no tensor {name}")
            return f.get_tensor(k)
        try:
            state = state_from_gpt2(get, p)
        except RuntimeError as e:  # a reshape of a tensor of another size: weights of another config
            raise ConfigError(f"{folder}: the weights do not fit config.json: tensor shape mismatch "
                              f"({str(e).splitlines()[0]})") from None
    tok = tokenizers.load(Path(tokenizer)) if tokenizer is not None else _hf_tokenizer(folder)
    eod = _check_tokenizer(tok, p, folder, None)
    if config.get("eos_token_id") not in (None, eod):
        raise ConfigError(f"tokenizer does not match the model {folder}: its end-of-text id is {eod}, "
                          f"the model's eos_token_id {config['eos_token_id']}")
    return LoadedModel(_build(p, state.__getitem__), tok, eod, "hf", None, None)


def load(path: Path, tokenizer: Path | None = None) -> LoadedModel:
    """A checkpoint folder (meta.json; needs `tokenizer`) or a Hugging Face folder (config.json)."""
    path = Path(path)
    if (path / "meta.json").is_file():
        if tokenizer is None:
            raise ConfigError(f"{path}: a checkpoint needs its tokenizer (tokenizer.json)")
        return load_checkpoint(path, tokenizer)
    if (path / "config.json").is_file():
        return load_hf(path, tokenizer)
    raise InputFileError(f"{path}: neither a checkpoint (meta.json) nor a Hugging Face model (config.json)")
