"""Size a run before renting the machines: parameters, and memory per GPU for a layout.

    python -m trainer.size mt-nlg-530b      # a profile of params.yaml `train.profiles`; none: every one

Per GPU, with ZeRO-1, at the profile's `optim.dtype`:
  bf16/fp16: weights 2 B + gradients 4 B per local parameter (DeepSpeed accumulates them in fp32);
  fp32: weights 4 B + gradients 4 B; either way an fp32 master copy + Adam moments, 12 B per local
  parameter / dp (ZeRO-1 keeps an fp32 partition even of fp32 weights). Activations for every
  micro-batch in flight (at most pp on the first stage under 1F1B): a layer's working set is
  s b h (10 + 24 / tp) bytes in 16-bit (Korthikanti et al. 2022, without the 5 a s / h attention-score
  term: scaled_dot_product_attention never materialises the scores), twice that in fp32; with
  recomputation only each layer's input (s b h values) is kept, plus one layer's working set.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from trainer.config import ModelParams, ParallelParams, Recipe, padded_vocab, plan

GIB = 2**30
GPT2_VOCAB = 50257  # MT-NLG's tokenizer: a profile is sized with it when no blend gives the vocabulary
DEFAULT_SEQ = 2048


def model_of(recipe: Recipe, vocab: int = GPT2_VOCAB, seq_len: int | None = None) -> ModelParams:
    """The profile's model: its shape, the vocabulary padded for its tp, its own context length
    (else `seq_len`, else 2048)."""
    seq = recipe.seq_len or seq_len or DEFAULT_SEQ
    return ModelParams(**recipe.model.model_dump(), seq_len=seq, vocab_size=padded_vocab(vocab, recipe.parallel.tp))


def parameters(m: ModelParams) -> int:
    """Every parameter once (the tied embedding counted once)."""
    h = m.d_model
    return m.vocab_size * h + m.seq_len * h + 2 * h + m.n_layer * (12 * h * h + 13 * h)


def size(m: ModelParams, par: ParallelParams, dtype: str = "bf16") -> dict:
    h, s, b = m.d_model, m.seq_len, par.micro_batch
    value = 4 if dtype == "fp32" else 2  # bytes of a weight or an activation
    layers_per_stage = math.ceil(m.n_layer / par.pp)
    # the busiest stage: its blocks plus the word and position embeddings (first stage). Split by tp:
    # the blocks' matrices and column biases, the vocabulary; whole on every tp rank: LayerNorms, the
    # row-parallel biases, the position embedding
    split = layers_per_stage * (12 * h * h + 5 * h) + m.vocab_size * h
    whole = layers_per_stage * 8 * h + m.seq_len * h
    local = split / par.tp + whole
    in_flight = min(par.pp, par.micro_batches)
    # a layer's working set: s b h (10 + 24 / tp) bytes (attention scores never materialised: SDPA);
    # recomputation keeps each layer's input only and one layer's working set at a time
    layer = s * b * h * (10 + 24 / par.tp) * value / 2
    if par.recompute:
        activations = value * s * b * h * layers_per_stage * in_flight + layer
    else:
        activations = layer * layers_per_stage * in_flight
    states = local * (value + 4) + local * 12 / par.dp
    return {"parameters": parameters(m), "parameters_per_gpu": int(local), "gpus": par.world_size,
            "weights_and_grads_gib": local * (value + 4) / GIB, "optimizer_gib": local * 12 / par.dp / GIB,
            "activations_gib": activations / GIB, "total_gib": (states + activations) / GIB}


def count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def report(name: str, recipe: Recipe, vocab: int = GPT2_VOCAB, seq_len: int | None = None) -> dict:
    """A profile validated (its layout checked as `plan` does before a launch) and sized."""
    m = model_of(recipe, vocab, seq_len)
    plan(m, recipe.parallel, recipe.parallel.world_size)
    r = size(m, recipe.parallel, recipe.optim.dtype)
    return {"profile": name, "parameters": r["parameters"], "gpus": r["gpus"],
            "layout": {"tp": recipe.parallel.tp, "pp": recipe.parallel.pp, "dp": recipe.parallel.dp},
            "parameters_per_gpu": r["parameters_per_gpu"], "gib_per_gpu": round(r["total_gib"], 2),
            "seq_len": m.seq_len, "vocab_size": m.vocab_size}


def data_shape(params) -> tuple[int, int, str]:
    """(vocabulary, context length, whence) as the train stage sizes its profiles: the finished blend's
    (data/tokenize), else params.yaml's tokenize section: a trained tokenizer's vocab_size, or the size
    of the tokenizer file it names (as the tokenizer pass reports it)."""
    from tasks.core.stage import Context
    from tasks.train.stage import blend_facts
    try:
        blend = params.train.input_stage
        facts, vocab = blend_facts(Context("train", str(params.paths.data_dir), blend))
        return vocab, facts["seq_length"], f"the blend in {params.paths.data_dir}/{blend}"
    except (OSError, KeyError, ValueError):
        t = params.tokenize
        if not t.tokenizer_file:
            return t.vocab_size, t.seq_length, "params.yaml: no finished blend"
        from tasks.tokenize import tokenizer
        tok = tokenizer.load(Path(t.tokenizer_file), Path(t.merges_file) if t.merges_file else None)
        return tokenizer.id_bound(tok), t.seq_length, f"params.yaml: no finished blend; {t.tokenizer_file}"


def main(argv: list[str]) -> int:
    from tasks.core.config import load_params
    from tasks.core.errors import describe
    try:
        params = load_params(argv[1] if len(argv) > 1 else "params.yaml")
        profiles = params.train.profiles
        vocab, seq_len, source = data_shape(params)
    except Exception as e:  # noqa: BLE001 - one line and the exit code, as every entry point
        code, line = describe(e)
        print(line, file=sys.stderr)
        return code
    names = argv[:1] or list(profiles)
    if any(n not in profiles for n in names):
        print(f"usage: python -m trainer.size [{'|'.join(profiles)}] [params.yaml]", file=sys.stderr)
        return 2
    print(f"vocabulary {vocab} and context length {seq_len} ({source}); a profile's own seq_len comes first")
    for name in names:
        recipe = profiles[name]
        m, par = model_of(recipe, vocab, seq_len), recipe.parallel
        try:
            plan(m, par, par.world_size)
        except Exception as e:  # noqa: BLE001 - the layout's one line
            print(f"{name}: {describe(e)[1]}", file=sys.stderr)
            return 2
        r = size(m, par, recipe.optim.dtype)
        print(f"{name}: {count(r['parameters'])} parameters; {m.n_layer} layers x {m.d_model} hidden x "
              f"{m.n_head} heads, sequence {m.seq_len}, vocabulary {m.vocab_size}")
        print(f"  layout tp {par.tp} x pp {par.pp} x dp {par.dp} = {r['gpus']} GPUs, micro-batch {par.micro_batch}, "
              f"global batch {par.global_batch} ({par.micro_batches} micro-batches per replica)")
        print(f"  per GPU (busiest stage): {count(r['parameters_per_gpu'])} parameters; weights + grads "
              f"{r['weights_and_grads_gib']:.1f} GiB, optimizer {r['optimizer_gib']:.1f} GiB, activations "
              f"{r['activations_gib']:.1f} GiB (recomputation {'on' if par.recompute else 'off'}): "
              f"{r['total_gib']:.1f} GiB of an 80 GiB GPU ({recipe.optim.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
