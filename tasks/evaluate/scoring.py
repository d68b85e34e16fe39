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

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from tasks.core.errors import InputFileError
from tasks.evaluate.model_io import LoadedModel

HEAD_ROWS = 2048  # rows per vocabulary projection: bounds the [rows, vocab] logits in memory
ENCODE_DOCS = 256  # docs tokenised at once (Scorer.encode)


def _move_trailing_space(ctx: str, cont: str) -> tuple[str, str]:
    """lm-eval's _encode_pair: the context's trailing whitespace goes to the continuation."""
    n = len(ctx) - len(ctx.rstrip())
    return (ctx[:-n], ctx[-n:] + cont) if n else (ctx, cont)


@dataclass
class _Sequence:
    tokens: np.ndarray       # the shared context, then each continuation but its last token (int32)
    context: int             # the shared context's tokens: positions 0.., segment 0 (seen by all)
    extras: list[int] = field(default_factory=list)  # each packed continuation's inputs: positions from `context`
    targets: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # (pair, input idx, tokens)

    def positions(self) -> np.ndarray:
        return np.concatenate([np.arange(self.context)] + [np.arange(self.context, self.context + e) for e in self.extras])

    def segments(self) -> np.ndarray:
        return np.concatenate([np.zeros(self.context, np.int64)] + [np.full(e, i + 1) for i, e in enumerate(self.extras)])


class Scorer:
    def __init__(self, lm: LoadedModel, token_budget: int = 16384, device: str = "cpu", progress: bool = True):
        self.lm, self.device, self.progress = lm, torch.device(device), progress
        self.window = lm.params.seq_len
        self.token_budget = max(token_budget, self.window)
        self.model = lm.model.to(self.device)

    # ---- tokenisation (lm-eval's _encode_pair)
    def encode(self, docs_pairs: list[list[tuple[str, str]]]) -> list[list[tuple[np.ndarray, list[int], bool]]]:
        """Per doc, per (context, continuation): the context's last seq_len + 1 tokens, the continuation's
        tokens, and whether the request was cut from the left to the window. ENCODE_DOCS docs are tokenised at
        a time and kept only as far as the window reaches: the full-length ids of every request, held for a
        whole evaluation, were ~20 GiB for MT-NLG's shots (BoolQ 32-shot prompts average ~14,000 tokens)."""
        out = []
        for a in range(0, len(docs_pairs), ENCODE_DOCS):
            split = [[_move_trailing_space(ctx, cont) for ctx, cont in pairs] for pairs in docs_pairs[a:a + ENCODE_DOCS]]
            texts = sorted({c for pairs in split for c, _ in pairs if c} | {c + t for pairs in split for c, t in pairs}
                           | {t for pairs in split for c, t in pairs if not c})
            ids = dict(zip(texts, (e.ids for e in self.lm.tokenizer.encode_batch(texts, add_special_tokens=False))))
            out.extend([self._pair(ctx, cont, ids) for ctx, cont in pairs] for pairs in split)
        return out

    def _pair(self, ctx: str, cont: str, ids: dict[str, list[int]]) -> tuple[np.ndarray, list[int], bool]:
        if not ctx:  # lm-eval: an empty context is the end-of-text token, unless the continuation starts with it
            t = ids[cont]
            c, t = (t[:1], t[1:]) if t and t[0] == self.lm.eod else ([self.lm.eod], t)
        else:
            c = ids[ctx]
            t = ids[ctx + cont][len(c):]
        if not t:  # nothing to score: it would count as certain (lm-eval refuses it too)
            raise InputFileError(f"the continuation {cont!r} after {ctx[-40:]!r} has no token of its own "
                                 f"(empty, or merged into the context's last token): nothing to score")
        return np.asarray(c[-(self.window + 1):], np.int32), t, len(c) + len(t) > self.window + 1

    # ---- sequences
    def _sequences(self, encoded: list[list[tuple[np.ndarray, list[int], bool]]]) -> list[_Sequence]:
        """`encoded[d]`: doc d's encoded pairs; pair ids are numbered across docs. A pair's input is its last
        seq_len + 1 tokens less the final one (lm-eval's left truncation), so its effective context is what
        of the context stays in that window: the pairs of a doc with the same effective context (all of
        them when nothing is truncated) share one sequence."""
        seqs, pair_id = [], 0
        for pairs in encoded:
            groups: dict[bytes, tuple[np.ndarray, list[tuple[int, list[int]]]]] = {}
            for ctx, cont, _ in pairs:
                if len(cont) > self.window:  # cannot be scored in the window (lm-eval stops the run here)
                    pair_id += 1
                    continue
                kept = ctx[max(0, len(ctx) + len(cont) - (self.window + 1)):]
                groups.setdefault(kept.tobytes(), (kept, []))[1].append((pair_id, cont))
                pair_id += 1
            for ctx, conts in groups.values():
                seqs.extend(self._packs(ctx, conts))
        return seqs

    def _packs(self, ctx: np.ndarray, conts: list[tuple[int, list[int]]]) -> list[_Sequence]:
        """The context once, then each continuation (all but its last token, which is only predicted),
        its positions continuing from the context's; a new sequence past twice the window."""
        out: list[tuple[int, list[np.ndarray], _Sequence]] = []  # (length so far, its pieces, the sequence)
        m = len(ctx)
        for pid, cont in conts:
            extra = max(len(cont) - 1, 0)
            if not out or out[-1][0] + extra > max(2 * self.window, m + extra):
                out.append((m, [ctx], _Sequence(ctx, m)))
            start, pieces, s = out[-1]
            pieces.append(np.asarray(cont[:-1], np.int32))
            s.extras.append(extra)
            s.targets.append((pid, [m - 1] + list(range(start, start + extra)), cont))
            out[-1] = (start + extra, pieces, s)
        for _, pieces, s in out:
            s.tokens = np.concatenate(pieces)
        return [s for _, _, s in out]

    # ---- scoring
    def score(self, docs_pairs: list[list[tuple[str, str]]], desc: str = "") -> list[list[tuple[float, bool] | None]]:
        """For each doc, for each of its (context, continuation): (log-likelihood, greedy), or None for a
        continuation longer than the model's window (no window holds it to score)."""
        return self.score_and_cut(docs_pairs, desc)[0]

    def score_and_cut(self, docs_pairs: list[list[tuple[str, str]]], desc: str = ""
                      ) -> tuple[list[list[tuple[float, bool] | None]], list[bool]]:
        """score(), and for each doc whether a request of it was cut from the left to the window."""
        encoded = self.encode(docs_pairs)
        cut = [any(c for _, _, c in pairs) for pairs in encoded]
        seqs = self._sequences(encoded)
        sizes = [len(pairs) for pairs in encoded]
        del encoded
        order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i].tokens), i))
        results: dict[int, tuple[float, bool]] = {}
        batches, i = [], 0
        while i < len(order):
            width = len(seqs[order[i]].tokens)
            rows = max(1, self.token_budget // width)
            batches.append(order[i:i + rows])
            i += rows
        bar = tqdm(batches, desc=f"eval {desc}".strip(), unit="batch", disable=not self.progress, leave=False)
        with torch.inference_mode():
            for batch in bar:
                results.update(self._score_batch([seqs[j] for j in batch]))
                for j in batch:  # scored: its tokens go
                    seqs[j] = None
        out, k = [], 0
        for n in sizes:
            out.append([results.get(k + j) for j in range(n)])
            k += n
        return out, cut

    def _score_batch(self, batch: list[_Sequence]) -> dict[int, tuple[float, bool]]:
        width = max(len(s.tokens) for s in batch)
        tokens = torch.zeros(len(batch), width, dtype=torch.long)
        positions = torch.zeros(len(batch), width, dtype=torch.long)
        segments = torch.full((len(batch), width), -1, dtype=torch.long)
        for b, s in enumerate(batch):
            n = len(s.tokens)
            tokens[b, :n], positions[b, :n], segments[b, :n] = (torch.from_numpy(s.tokens.astype(np.int64)),
                                                                torch.from_numpy(s.positions()),
                                                                torch.from_numpy(s.segments()))
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
