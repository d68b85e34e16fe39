"""Text generation from the evaluated model: greedy, and sampled with temperature, top-k and top-p
(nucleus), seeded. The context is the last seq_len tokens; generation stops at <|endoftext|>."""
from __future__ import annotations

import torch

from tasks.evaluate.model_io import LoadedModel
from tasks.tokenize.tokenizer import id_bound


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits outside the top-k / the top-p nucleus set to -inf (the most likely token always stays)."""
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        order = torch.argsort(logits, descending=True)
        probs = torch.softmax(logits[order], -1)
        drop = probs.cumsum(-1) - probs >= top_p  # tokens after the nucleus is already full
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


@torch.inference_mode()
def generate(lm: LoadedModel, prompt: str, max_new_tokens: int, temperature: float | None = None,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> str:
    """The continuation of `prompt`: greedy when temperature is None, else sampled."""
    model, window = lm.model, lm.params.seq_len
    device = next(model.parameters()).device
    ids = lm.tokenizer.encode(prompt, add_special_tokens=False).ids or [lm.eod]
    gen = torch.Generator().manual_seed(seed)
    new: list[int] = []
    vocab = id_bound(lm.tokenizer)  # padding rows of the embedding are never generated
    for _ in range(max_new_tokens):
        context = torch.tensor([(ids + new)[-window:]], device=device)
        logits = model(context)[0, -1, :vocab].float().cpu()
        if not bool(torch.isfinite(logits).all()):  # a diverged checkpoint: nothing to sample from (multinomial
            break                                     # raised, and the scheduled pass stopped at it)
        if temperature is None:
            token = int(logits.argmax())
        else:
            probs = torch.softmax(_filter(logits / temperature, top_k, top_p), -1)
            token = int(torch.multinomial(probs, 1, generator=gen))
        if token == lm.eod:
            break
        new.append(token)
    return lm.tokenizer.decode(new)
