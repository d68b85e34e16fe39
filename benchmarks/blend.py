"""Tokenize + blend benchmark.

    python -m benchmarks.blend [--mb 6] [--repeats 3]

Five generated datasets of uneven sizes (prose from tasks.sample.text, 1/2/4/8/16 parts of `--mb`)
with weights that make some need several epochs and others less than one. Prints:
  blend_max_share_error   largest |target - realised| share over every prefix (>= 1,000) of 100k blended samples
  tokenize_overhead_ratio the stage's tokens pass (Parquet in, pieces out) over a bare loop that only
                          calls Tokenizer.encode_batch on the same texts; one core (TOKENIZERS_PARALLELISM
                          off in both); median of interleaved repeats
  blend_index_100m_s      seconds to build a 100M-sample blend index over MT-NLG's 15 weights, one core
  tokens_per_s            tokens per second of the stage's tokens pass on one core
The last line is `blend_max_share_error=<e> tokenize_overhead_ratio=<r> blend_index_100m_s=<s> tokens_per_s=<n>`.
"""
from __future__ import annotations

import argparse
import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core: before tokenizers is imported

import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks import at_least  # noqa: E402
from tasks.core.config import parse_params  # noqa: E402
from tasks.core.runner import adopt_outputs, run_stage  # noqa: E402
from tasks.core.schema import write_docs  # noqa: E402
from tasks.core.stage import Context  # noqa: E402
from tasks.sample.text import TOPICS, paragraphs  # noqa: E402
from tasks.tokenize import indices, tokenizer  # noqa: E402
from tasks.tokenize.pieces import plan_tokens, tokenize_shard  # noqa: E402

MTNLG = [14.3, 19.3, 5.7, 2.9, 4.8, 0.9, 1.0, 0.2, 9.4, 1.4, 1.6, 13.0, 15.7, 9.0, 0.9]
DATASETS = [("web", 16, 0.30), ("books", 8, 0.30), ("code", 4, 0.05), ("wiki", 2, 0.25), ("papers", 1, 0.10)]


def generate(data: Path, total_mb: float) -> None:
    rng = random.Random(7)
    unit = total_mb * 1e6 / sum(parts for _, parts, _ in DATASETS)
    shards = data / "decontaminate/shards"
    shards.mkdir(parents=True)
    for name, parts, _ in DATASETS:
        docs, size, i = [], 0, 0
        while size < parts * unit:
            text = "\n\n".join(paragraphs(rng, rng.choice(sorted(TOPICS)), rng.randint(1, 6)))
            docs.append({"id": f"{name}/{i}", "text": text, "dataset": name, "url": "", "crawl": "", "lang": "en",
                         "lang_score": 1.0})
            size += len(text)
            i += 1
        half = len(docs) // 2
        write_docs(shards / f"{name}-0.parquet", docs[:half])
        write_docs(shards / f"{name}-1.parquet", docs[half:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=at_least(0.1, float), default=6.0, help="MB of generated text in all")
    ap.add_argument("--repeats", type=at_least(1), default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        generate(data, args.mb)
        p = parse_params({"paths": {"data_dir": str(data)}, "tokenize": {
            "vocab_size": 8192, "seq_length": 1024, "train_tokens": 1024,  # one sample: a run to learn the sizes
            "blend": [{"dataset": n, "weight": w} for n, _, w in DATASETS]}})
        adopt_outputs(p, "decontaminate")
        # a first run to learn the corpus's size, then the budget = the corpus: epochs from 0.2 to ~5
        stats = run_stage("tokenize", p)
        corpus_tokens = sum(d["tokens"] for d in stats["datasets"].values())
        p = p.model_copy(update={"tokenize": p.tokenize.model_copy(update={"train_tokens": corpus_tokens})})
        stats = run_stage("tokenize", p)
        print(f"{'dataset':<8}{'tokens':>12}{'target':>9}{'realised':>10}{'epochs':>8}")
        for name in stats["blend_order"]:
            row = stats["blend"][name]
            print(f"{name:<8}{row['tokens']:>12,}{row['target_share']:>9.3f}{row['realised_share']:>10.4f}"
                  f"{row['epochs']:>8.2f}")

        weights = indices.normalise_weights([w for _, _, w in DATASETS])
        first, _ = indices.blending_indices(weights, 100_000)
        # over every prefix of 1,000 samples or more: at exactly 100,000 each weight is a whole number of
        # samples, and the error there was 0 by construction
        seen = np.cumsum(np.eye(len(weights), dtype=np.int64)[first], axis=0)[999:]
        share_error = float(np.abs(seen / np.arange(1000, len(first) + 1)[:, None] - weights).max())

        ctx = Context("tokenize", str(data), "decontaminate")
        tok = tokenizer.load(ctx.pass_dir("tokenizer") / "tokenizer.json")
        shards = plan_tokens(p, ctx)
        texts = [[b.column("text").to_pylist() for b in pq.ParquetFile(s.inputs[0]).iter_batches(
            batch_size=p.tokenize.batch_docs, columns=["text"])] for s in shards]
        megabytes = sum(len(t.encode()) for shard in texts for batch in shard for t in batch) / 1e6
        out = Path(tmp) / "piece.parquet"

        def stage_pass():
            tokens = 0
            for s in shards:
                tokens += tokenize_shard(s, out, p, ctx).extra["tokens"]
            return tokens

        def bare():
            for shard in texts:
                for batch in shard:
                    tok.encode_batch(batch, add_special_tokens=False)
        times = {"stage": [], "bare": []}
        for _ in range(args.repeats):  # interleaved
            for label, fn in (("stage", stage_pass), ("bare", bare)):
                t0 = time.perf_counter()
                result = fn()
                times[label].append(time.perf_counter() - t0)
                if label == "stage":
                    tokens = result
        stage_s, bare_s = statistics.median(times["stage"]), statistics.median(times["bare"])
        print(f"tokens pass {stage_s:.2f} s, bare encode_batch {bare_s:.2f} s on {megabytes:.1f} MB "
              f"({megabytes / stage_s:.2f} MB/s per core in the stage)")

    mtnlg = indices.normalise_weights(MTNLG)
    indices.blending_indices(mtnlg, 1000)  # compile outside the timing
    t0 = time.perf_counter()
    indices.blending_indices(mtnlg, 100_000_000)
    blend_s = time.perf_counter() - t0
    print(f"blend_max_share_error={share_error:.6f} tokenize_overhead_ratio={stage_s / bare_s:.3f} "
          f"blend_index_100m_s={blend_s:.2f} tokens_per_s={tokens / stage_s:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
