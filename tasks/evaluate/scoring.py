"""Log-likelihood of continuations given contexts, as lm-evaluation-harness computes it, in fewer FLOPs.

Tokenisation is lm-eval's (`_encode_pair`): trailing spaces of the context move to the continuation; the
context is encoded alone and the continuation is what encoding context + continuation adds after it;
an empty context becomes <|endoftext|>; no BOS. A request longer than the window keeps its last
seq_len + 1 tokens (truncated from the left). The score of a continuation is the sum of its tokens'
log-probabilities, and it is "greedy" when every one of its tokens is the argmax.

Where the work goes down (each exact, not an approximation):
- One forward per shared context: the choices of a doc that share its context are packed after it in
  one sequence; each choice's tokens see the context and themselves only (attention mask), with their
  positions restarting where the context ends. lm-eval reruns the context for every multi-token choice.
- The head only where a continuation token is predicted: the vocabulary projection and log-softmax run
  on those rows only, not on every position (for a small model the head is most of the FLOPs).
- Sequences sorted by length and batched under a token budget, so padding stays within a batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from tasks.core.errors import InputFileError
from tasks.evaluate.model_io import LoadedModel

HEAD_ROWS = 2048  # rows per vocabulary projection: bounds the [rows, vocab] logits in memory


@dataclass
class _Sequence:
    tokens: list[int]
    positions: list[int]
    segments: list[int]      # 0: the shared context (seen by all); i + 1: continuation i's own tokens
    targets: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # (pair, input idx, tokens)


class Scorer:
    def __init__(self, lm: LoadedModel, token_budget: int = 16384, device: str = "cpu", progress: bool = True):
        self.lm, self.device, self.progress = lm, torch.device(device), progress
        self.window = lm.params.seq_len
        self.token_budget = max(token_budget, self.window)
        self.model = lm.model.to(self.device)
        self._cache: dict[str, list[int]] = {}

    # ---- tokenisation (lm-eval's _encode_pair)
    def _encode_all(self, texts: set[str]) -> None:
        new = sorted(t for t in texts if t not in self._cache)
        for text, enc in zip(new, self.lm.tokenizer.encode_batch(new, add_special_tokens=False)):
            self._cache[text] = enc.ids

    def encode_pairs(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        split = []
        for ctx, cont in pairs:
            n = len(ctx) - len(ctx.rstrip())
            if n:
                ctx, cont = ctx[:-n], ctx[-n:] + cont
            split.append((ctx, cont))
        self._encode_all({c for c, _ in split if c} | {c + t for c, t in split} | {t for c, t in split if not c})
        out = []
        for ctx, cont in split:
            if not ctx:  # lm-eval: an empty context is the end-of-text token, unless the continuation starts with it
                t = self._cache[cont]
                out.append((t[:1], t[1:]) if t and t[0] == self.lm.eod else ([self.lm.eod], t))
            else:
                c = self._cache[ctx]
                out.append((c, self._cache[ctx + cont][len(c):]))
            if not out[-1][1]:  # nothing to score: it would count as certain (lm-eval refuses it too)
                raise InputFileError(f"the continuation {cont!r} after {ctx[-40:]!r} has no token of its own "
                                     f"(empty, or merged into the context's last token): nothing to score")
        return out

    # ---- sequences
    def _sequences(self, encoded: list[list[tuple[list[int], list[int]]]]) -> list[_Sequence]:
        """`encoded[d]`: doc d's (context, continuation) token pairs; pair ids are numbered across docs.
        A pair's input is its last seq_len + 1 tokens less the final one (lm-eval's left truncation), so
        its effective context is what of the context stays in that window: the pairs of a doc with the
        same effective context (all of them when nothing is truncated) share one sequence."""
        seqs, pair_id = [], 0
        for pairs in encoded:
            groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
            for ctx, cont in pairs:
                if len(cont) > self.window:  # cannot be scored in the window (lm-eval stops the run here)
                    pair_id += 1
                    continue
                window = (ctx + cont)[-(self.window + 1):]
                groups.setdefault(tuple(window[:len(window) - len(cont)]), []).append((pair_id, cont))
                pair_id += 1
            for ctx, conts in groups.items():
                seqs.extend(self._packs(list(ctx), conts))
        return seqs

    def _packs(self, ctx: list[int], conts: list[tuple[int, list[int]]]) -> list[_Sequence]:
        """The context once, then each continuation (all but its last token, which is only predicted),
        its positions continuing from the context's; a new sequence past twice the window."""
        out: list[_Sequence] = []
        m = len(ctx)
        for pid, cont in conts:
            extra = max(len(cont) - 1, 0)
            if not out or len(out[-1].tokens) + extra > max(2 * self.window, m + extra):
                out.append(_Sequence(list(ctx), list(range(m)), [0] * m))
            s = out[-1]
            start, seg = len(s.tokens), len(s.targets) + 1
            s.tokens += cont[:-1]
            s.positions += range(m, m + extra)
            s.segments += [seg] * extra
            s.targets.append((pid, [m - 1] + list(range(start, start + extra)) if cont else [], cont))
        return out

    # ---- scoring
    def score(self, docs_pairs: list[list[tuple[str, str]]], desc: str = "") -> list[list[tuple[float, bool] | None]]:
        """For each doc, for each of its (context, continuation): (log-likelihood, greedy), or None for a
        continuation longer than the model's window (no window holds it to score)."""
        encoded = [self.encode_pairs(pairs) for pairs in docs_pairs]
        seqs = self._sequences(encoded)
        order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i].tokens), i))
        results: dict[int, tuple[float, bool]] = {}
        batches, i = [], 0
        while i < len(order):
            width = len(seqs[order[i]].tokens)
            rows = max(1, self.token_budget // width)
            batches.append([seqs[j] for j in order[i:i + rows]])
            i += rows
        bar = tqdm(batches, desc=f"eval {desc}".strip(), unit="batch", disable=not self.progress, leave=False)
        with torch.inference_mode():
            for batch in bar:
                results.update(self._score_batch(batch))
        out, k = [], 0
        for pairs in encoded:
            out.append([results.get(k + j) for j in range(len(pairs))])
            k += len(pairs)
        return out

    def _score_batch(self, batch: list[_Sequence]) -> dict[int, tuple[float, bool]]:
        width = max(len(s.tokens) for s in batch)
        tokens = torch.zeros(len(batch), width, dtype=torch.long)
        positions = torch.zeros(len(batch), width, dtype=torch.long)
        segments = torch.full((len(batch), width), -1, dtype=torch.long)
        for b, s in enumerate(batch):
            n = len(s.tokens)
            tokens[b, :n], positions[b, :n], segments[b, :n] = (torch.tensor(s.tokens), torch.tensor(s.positions),
                                                                torch.tensor(s.segments))
        mask = None  # plain causal attention unless a sequence packs two or more continuations
        if segments.max() > 1:
            causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
            seg_q, seg_k = segments[:, :, None].to(self.device), segments[:, None, :].to(self.device)
            mask = causal & ((seg_k == 0) | (seg_k == seg_q))   # padding (-1) is seen by no real token
        h = self.model.hidden(tokens.to(self.device), positions.to(self.device), mask)
        rows, targets, owners = [], [], []
        for b, s in enumerate(batch):
            for pid, idx, cont in s.targets:
                rows += [b * width + i for i in idx]
                targets += cont
                owners.append((pid, len(cont)))
        h = h.reshape(-1, h.shape[-1])[torch.tensor(rows, dtype=torch.long, device=self.device)]
        target = torch.tensor(targets, dtype=torch.long, device=self.device)
        logp, hit = [], []
        weight = self.model.wte.weight
        for a in range(0, len(rows), HEAD_ROWS):
            lp = F.log_softmax((h[a:a + HEAD_ROWS] @ weight.t()).float(), dim=-1)
            t = target[a:a + HEAD_ROWS]
            logp.append(lp.gather(1, t[:, None])[:, 0])
            hit.append(lp.argmax(-1) == t)
        logp_all, hit_all = torch.cat(logp).cpu(), torch.cat(hit).cpu()
        out, k = {}, 0
        for pid, n in owners:
            out[pid] = (float(logp_all[k:k + n].sum()), bool(hit_all[k:k + n].all()))
            k += n
        return out
