"""The evaluator: prompts as lm-evaluation-harness writes them, packed scoring equal to one plain forward
per request, model loading from a checkpoint or a Hugging Face folder, and the bad inputs."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tasks.core.errors import ConfigError, InputFileError
from tasks.evalsets.loaders import TaskData, TaskFileError, load_task
from tasks.evalsets import prompts
from tasks.evaluate import model_io
from tasks.evaluate.evaluator import evaluate_task, select
from tasks.evaluate.scoring import Scorer
from tasks.tokenize import tokenizer as tokenizers
from trainer.config import ModelParams
from trainer.export import gpt2_state, hf_config, state_from_gpt2
from trainer.model import GPT

TEXT = ["The cat sat on the mat and looked at the dog.", "Is the sky blue? Yes, the sky is blue today.",
        "A man is sitting on a roof. He starts pulling up roofing.", "Question: how do you boil water?\nAnswer:"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A small seeded GPT with a 32-token window (so truncation happens) and a BPE trained on TEXT."""
    tok = tokenizers.train([TEXT * 20], vocab_size=300, min_frequency=1)
    folder = tmp_path_factory.mktemp("hf")
    tok.save(str(folder / "tokenizer.json"))
    p = ModelParams(n_layer=2, n_head=2, d_model=32, seq_len=32, vocab_size=384, fused_kernels=False, init_std=0.2)
    state = dict(GPT(p, seed=3).named_parameters())
    save_file(gpt2_state(lambda n: state[n].detach(), p), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config(p, tokenizers.eod_id(tok))), encoding="utf-8")
    return model_io.load(folder)


def test_prompts_are_lm_eval_formats():
    d = prompts.boolq({"question": "is the sky blue", "passage": "It is.", "title": "Sky", "label": True})
    assert d.pairs() == [("Sky -- It is.\nQuestion: is the sky blue?\nAnswer:", " no"),
                         ("Sky -- It is.\nQuestion: is the sky blue?\nAnswer:", " yes")] and d.gold == 1
    d = prompts.lambada({"text": "he said hello to Anna"})
    assert d.pairs() == [("he said hello to", " Anna")] and d.shot == "he said hello to  Anna"
    d = prompts.hellaswag({"activity_label": "Roof shingle removal", "ctx_a": "A man is on a roof.", "ctx_b": "he",
                           "endings": ["starts [title] pulling.", "x"], "label": 0})
    assert d.pairs()[0] == ("Roof shingle removal: A man is on a roof. He", " starts. pulling.")
    d = prompts.winogrande({"sentence": "Anna gave Bob _ book because he asked.", "option1": "Anna",
                            "option2": "Bob", "label": 1})
    assert d.pairs() == [("Anna gave Bob Anna", " book because he asked."), ("Anna gave Bob Bob", " book because he asked.")]
    assert d.gold == 1 and d.shot == "Anna gave Bob Bob book because he asked."
    d = prompts.anli({"context": "P.", "hypothesis": "H.", "label": "c"})
    assert d.pairs()[2] == ("P.\nQuestion: H. True, False, or Neither?\nAnswer:", " False") and d.gold == 2
    d = prompts.hans({"sentence1": "A.", "sentence2": "B.", "label": False})
    assert d.pairs()[0][0] == "A.\nQuestion: B. True or False?\nAnswer:" and d.gold == 1
    d = prompts.wic({"sentence1": "Do you want to come over to my place later ?", "sentence2": "No place .",
                     "indices": "8-1", "word": "place", "label": True})
    assert "Is the word 'place' used in the same way" in d.pairs()[0][0] and d.gold == 1
    art = {"article": "Text.", "id": "a1"}
    qs = [dict(art, question="The author is  _  .", options=["a", "b", "c", "d"], label=1),
          dict(art, question="Why?", options=["w", "x", "y", "z"], label=0),
          dict(art, question="Last?", options=["p", "q", "r", "s"], label=3)]
    d = prompts.race(prompts.race_articles(qs)[0])
    assert d.pairs()[3] == ("Article: Text.\n\nThe author is b\nQuestion: Why?\nAnswer: w\nLast?", " s")


def test_fewshot_prefixes_are_seeded_and_never_the_doc_itself():
    docs = [prompts.hans({"sentence1": f"S{i}.", "sentence2": "T.", "label": True}) for i in range(6)]
    a = prompts.fewshot_prefixes(list(range(6)), docs, None, 2, seed=7)
    assert a == prompts.fewshot_prefixes(list(range(6)), docs, None, 2, seed=7)
    for i, prefix in enumerate(a):
        assert prefix.endswith("\n\n") and prefix.count("Answer: True") == 2 and f"S{i}." not in prefix
    with pytest.raises(ConfigError, match="3-shot needs 4 few-shot examples, the few-shot split has 2"):
        prompts.fewshot_prefixes([0], docs[:1], docs[1:3], 3, seed=7)


@pytest.mark.parametrize("one_more", [True, False])
def test_fewshot_draws_follow_lm_evals_sampler(one_more):
    """lm-eval 0.4.13's sampler: one random.Random(seed) per task; sample(docs, k + 1) when its few-shot
    split is the test split, then the first k drawn that are not the doc; else sample(docs, k), where
    lm-eval keeps a draw of the doc itself and this drops it (its answer would be in its prompt)."""
    import random
    docs = [prompts.hans({"sentence1": f"S{i}.", "sentence2": "T.", "label": i % 2 == 0}) for i in range(12)]
    rnd, want = random.Random(1234), []
    for doc in docs:
        drawn = rnd.sample(docs, 4 if one_more else 3)
        want.append("\n\n".join(d.shot for d in [d for d in drawn if d != doc][:3]) + "\n\n")
    got = prompts.fewshot_prefixes(list(range(12)), docs, None, 3, 1234, draw_one_more=one_more)
    assert got == want
    for doc, prefix in zip(docs, got):  # LAMBADA, RACE, ANLI: a doc drawn as its own shot showed its answer
        assert doc.shot not in prefix
    if not one_more:  # 12 docs, 3 drawn each: some doc draws itself here, and gets 2 shots
        assert any(prefix.count("\n\n") == 2 for prefix in got)


def _plain_scores(lm, pairs):
    """lm-eval's procedure, one request at a time, on full logits."""
    out = []
    for ctx, cont in pairs:
        n = len(ctx) - len(ctx.rstrip())
        if n:
            ctx, cont = ctx[:-n], ctx[-n:] + cont
        c = lm.tokenizer.encode(ctx, add_special_tokens=False).ids if ctx else [lm.eod]
        t = lm.tokenizer.encode(ctx + cont, add_special_tokens=False).ids[len(c):] if ctx else \
            lm.tokenizer.encode(cont, add_special_tokens=False).ids
        if not ctx and t[0] == lm.eod:  # lm-eval: the continuation's own end-of-text token is the context
            c, t = t[:1], t[1:]
        inp = (c + t)[-(lm.params.seq_len + 1):][:-1]
        with torch.no_grad():
            logp = F.log_softmax(lm.model(torch.tensor([inp]))[0, -len(t):], -1)
        out.append((float(logp[range(len(t)), t].sum()), bool((logp.argmax(-1) == torch.tensor(t)).all())))
    return out


def test_a_continuation_longer_than_the_window_is_not_scored(lm):
    got = Scorer(lm, progress=False).score([[("Hi", " the cat" * 40), ("Hi", " the")]])
    assert got[0][0] is None and got[0][1] is not None


def test_packed_scoring_equals_one_forward_per_request(lm):
    long = " ".join(TEXT)  # longer than the 32-token window: truncated from the left
    docs = [[("Question: how do you boil water?\nAnswer:", c) for c in (" Heat it.", " the cat sat on it", " Yes")],
            [(long, " the dog."), (long, " blue")], [("", " The cat sat."), ("", "<|endoftext|> The cat sat.")],
            [("Anna gave Bob ", "the mat."), ("Anna gave Bob", " the mat.")]]
    got = Scorer(lm, token_budget=64, progress=False).score(docs)
    for doc, scored in zip(docs, got):
        for (a, ga), (b, gb) in zip(scored, _plain_scores(lm, doc)):
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-4) and ga == gb


def test_the_scorer_keeps_no_request_past_its_window_nor_past_the_call(lm):
    """A review: one Scorer for a whole evaluation kept the full-length token ids of every request it had seen
    (MT-NLG's 50-shot prompts: ~20 GiB projected on a 23 GiB machine), where only each request's last
    seq_len + 1 tokens are ever used."""
    import tracemalloc
    long = " ".join(TEXT * 40)
    docs = [[(f"{i} {long}", " the dog."), (f"{i} {long}", " blue")] for i in range(60)]
    scorer = Scorer(lm, progress=False)
    encoded = scorer.encode(docs[:2])
    assert all(len(ctx) == lm.params.seq_len + 1 and cut for pairs in encoded for ctx, _, cut in pairs)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        scored, cut = scorer.score_and_cut(docs)
        kept = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename") if d.size_diff > 0)
    finally:
        tracemalloc.stop()
    assert cut == [True] * 60 and all(x is not None for doc in scored for x in doc)
    assert kept < 1 << 20, f"{kept:,} bytes kept after the call"


def test_a_continuation_with_no_token_of_its_own_is_refused(lm):
    """lm-eval asserts on it; scored, it had no token to predict and counted as certain (log-likelihood 0,
    greedy), winning any multiple choice."""
    for pair in (("The cat sat on the ma", "t"), ("The cat sat.", "")):
        with pytest.raises(InputFileError, match="has no token of its own"):
            Scorer(lm, progress=False).score([[pair, ("The cat sat.", " Yes")]])


def test_the_shared_context_is_run_once(lm, monkeypatch):
    calls = []
    original = lm.model.hidden
    monkeypatch.setattr(lm.model, "hidden", lambda t, *a: calls.append(t.shape) or original(t, *a))
    Scorer(lm, progress=False).score([[("Is the sky blue?", c) for c in (" Yes, it is.", " the cat sat", " No")]])
    assert len(calls) == 1 and calls[0][0] == 1  # one sequence for the three choices


def test_hf_mapping_round_trips_and_loads_the_same_weights(lm):
    p = lm.params
    ours = {n: t.detach() for n, t in GPT(p, seed=3).named_parameters()}
    back = state_from_gpt2(gpt2_state(ours.__getitem__, p).__getitem__, p)
    assert all(torch.equal(back[n], ours[n]) for n in ours)
    assert all(torch.equal(t, ours[n]) for n, t in lm.model.named_parameters())


def test_a_tokenizer_that_is_not_the_models_is_refused(lm, tmp_path):
    big = tokenizers.train([[f"w{i} v{i * 7} u{i * 13}" for i in range(3000)]], vocab_size=600, min_frequency=1)
    assert big.get_vocab_size() > 384
    (tmp_path / "config.json").write_text(json.dumps(hf_config(lm.params, 0)), encoding="utf-8")
    big.save(str(tmp_path / "tokenizer.json"))
    save_file(gpt2_state(lambda n: dict(lm.model.named_parameters())[n].detach(), lm.params),
              str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="tokenizer does not match the model .*: [0-9]+ tokens, the model embeds 384"):
        model_io.load(tmp_path)
    lm.tokenizer.save(str(tmp_path / "tokenizer.json"))
    cfg = hf_config(lm.params, lm.eod + 1)
    (tmp_path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(ConfigError, match="end-of-text id is 0, the model's eos_token_id 1"):
        model_io.load(tmp_path)
    other = hf_config(lm.params, lm.eod) | {"n_embd": 64, "n_inner": 256}  # another model config than the weights
    (tmp_path / "config.json").write_text(json.dumps(other), encoding="utf-8")
    with pytest.raises(ConfigError, match="shape"):
        model_io.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(lm.params, lm.eod) | {"tie_word_embeddings": False}))
    with pytest.raises(ConfigError, match="tie_word_embeddings=False is another network"):
        model_io.load(tmp_path)
    with pytest.raises(InputFileError, match="neither a checkpoint"):
        model_io.load(tmp_path / "nowhere")


def test_task_files_missing_or_empty_fail_naming_the_file(tmp_path):
    with pytest.raises(TaskFileError, match="task 'boolq': file not found"):
        load_task("boolq", tmp_path)
    (tmp_path / "anli/R2").mkdir(parents=True)
    (tmp_path / "anli/R2/test.jsonl").write_text('{"context": "a", "hypothesis": "b", "label": "e"}\n')
    (tmp_path / "anli/R2/dev.jsonl").write_text("\n")
    with pytest.raises(TaskFileError, match="file has no records.*dev.jsonl"):
        load_task("anli_r2", tmp_path, fewshot=True)


def test_the_stage_refuses_a_bad_task_file_before_its_last_results_are_removed(tmp_path):
    from tasks.core.config import parse_params
    from tasks.core.runner import run_stage

    p = parse_params({"paths": {"data_dir": str(tmp_path / "data"), "benchmarks_dir": str(tmp_path / "bench")}})
    for stage, extra in (("train", ', "adopted": true'), ("evaluate", "")):  # a model made elsewhere
        (tmp_path / "data" / stage).mkdir(parents=True)
        (tmp_path / "data" / stage / "stats.json").write_text(f'{{"stage": "{stage}"{extra}}}')
    (tmp_path / "bench").mkdir()
    with pytest.raises(TaskFileError, match="task 'lambada': file not found"):
        run_stage("evaluate", p)
    assert (tmp_path / "data/evaluate/stats.json").read_text() == '{"stage": "evaluate"}'


def test_task_metrics_on_a_real_task(lm, benchmarks_dir):
    task = load_task("piqa", benchmarks_dir, fewshot=True)
    scorer = Scorer(lm, progress=False)
    rows = evaluate_task(scorer, task, 0, limit=20)
    # the 32-token window cannot hold some solutions in this tiny vocabulary: those docs are counted apart
    assert [r["metric"] for r in rows] == ["acc", "acc_norm"] and all(r["n"] + r["skipped"] == 20 for r in rows)
    assert rows[0]["skipped"] > 0 and rows[0]["n"] > 5
    assert all(0 <= r["value"] <= 1 and r["stderr"] > 0 for r in rows)
    assert rows == evaluate_task(scorer, task, 0, limit=20)  # deterministic
    one = evaluate_task(scorer, task, 1, limit=5)
    assert one[0]["shots"] == 1 and one[0]["n"] + one[0]["skipped"] == 5
    assert select(10, 3, 1) == select(10, 3, 1) and len(select(10, 3, 1)) == 3 and select(10, None, 1) == list(range(10))
    with pytest.raises(ConfigError, match="task piqa: 20000-shot needs 20001 few-shot examples"):
        evaluate_task(scorer, task, 20000, limit=2)
    lam = evaluate_task(scorer, TaskData("lambada", [{"text": "the cat sat on the mat"}] * 3, ("text",)), 0)
    assert [r["metric"] for r in lam] == ["acc", "perplexity"] and lam[1]["value"] > 1


def test_few_shot_prompts_cut_to_the_window_are_counted_and_warned_of(lm):
    """At the sample's 128-token window most few-shot prompts lost their shots to the left truncation, and
    the few-shot scores read as zero-shot ones, with nothing saying so."""
    from tasks.evaluate.evaluator import cut_shots_warnings
    task = TaskData("lambada", [{"text": f"the cat sat on mat {i}"} for i in range(8)], ("text",))
    scorer = Scorer(lm, progress=False)
    zero, five = evaluate_task(scorer, task, 0), evaluate_task(scorer, task, 5)
    assert zero[0]["cut"] == 0 and five[0]["cut"] == five[0]["n"] == 8  # 32 tokens hold no 5 shots here
    assert cut_shots_warnings(zero) == []
    assert cut_shots_warnings(five, 32) == [
        "few-shot prompts cut to the model's 32-token window, their shots lost, so these scores are not k-shot ones: "
        "lambada 5-shot (8 of 8)"]


def test_the_report_table_gives_piqa_and_hellaswag_their_normalised_accuracy_too():
    """MT-NLG's HellaSwag figures are at the level of length-normalised accuracy: the table shows it beside acc."""
    from tasks.evaluate.run import figure3_table
    row = lambda task, shots, metric, value: {"task": task, "shots": shots, "metric": metric, "value": value,
                                              "stderr": 0.01}
    rows = [row("hellaswag", 0, "acc", 0.61), row("hellaswag", 0, "acc_norm", 0.78), row("boolq", 0, "acc", 0.7),
            row("hellaswag", 20, "acc", 0.62), row("hellaswag", 20, "acc_norm", 0.8),
            row("lambada", 0, "acc", 0.7), row("lambada", 0, "perplexity", 5.0)]
    assert figure3_table(rows).splitlines() == [
        "| task | zero-shot | few-shot |", "|---|---|---|",
        "| hellaswag | 0.610 ± 0.010, acc_norm 0.780 | 0.620 ± 0.010, acc_norm 0.800 (k=20) |",
        "| boolq | 0.700 ± 0.010 |  |", "| lambada | 0.700 ± 0.010 |  |"]


def test_the_suite_checks_the_docs_scored_and_metrics_json(tmp_path, benchmarks_dir):
    """n = 1 where `limit` asked for 5 docs, and a metrics.json that is not the results' values, passed the
    suite (a review's mutations): it now counts the task's docs and compares what `dvc metrics` shows."""
    from tasks.core.config import parse_params
    from tasks.evaluate.run import write_results
    from tasks.validation import ExpectationFailed, validate_stage
    p = parse_params({"paths": {"data_dir": str(tmp_path / "data"), "benchmarks_dir": str(benchmarks_dir)},
                      "evaluate": {"tasks": ["wic"], "shots": ["zero"], "limit": 5}})
    out = tmp_path / "data/evaluate/results"
    prov = {"params_sha256": "0" * 64, "checkpoint": {"step": 1}}

    def results(n: int, skipped: int = 0) -> None:
        row = {"task": "wic", "shots": 0, "metric": "acc", "value": 0.5, "stderr": 0.2, "n": n,
               "skipped": skipped, "cut": 0}
        write_results(out, [row], [], prov, 1.0)

    results(4, skipped=1)
    assert validate_stage("evaluate", p).success
    results(1)
    with pytest.raises(ExpectationFailed, match="docs_not_the_tasks': 1 unexpected in shard wic 0-shot acc"):
        validate_stage("evaluate", p)
    results(5)
    (out / "metrics.json").write_text(json.dumps({"wic": {"0-shot": {"acc": 0.9}}}))
    with pytest.raises(ExpectationFailed) as failed:  # once, as the fact about the whole output it is
        validate_stage("evaluate", p)
    assert failed.value.failures == ["expect_column_values_to_be_between on column 'metrics_json_differs': 1 in the "
                                     "whole output"]
    # a NaN stderr, and a second row for the same (task, shots, metric): both passed (a review)
    row = {"task": "wic", "shots": 0, "metric": "acc", "value": 0.5, "stderr": float("nan"), "n": 5, "skipped": 0,
           "cut": 0}
    write_results(out, [{**row, "value": 0.7, "stderr": 0.1}, row], [], prov, 1.0)
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("evaluate", p)
    assert {f.split(":")[0] for f in failed.value.failures} == {
        "expect_column_values_to_be_between on column 'stderr_invalid'",
        "expect_column_values_to_be_between on column 'rows_for_it'"}, failed.value.failures


def test_generation_greedy_and_sampled(lm):
    from tasks.evaluate.generate import generate
    greedy = generate(lm, "The cat", 8)
    assert greedy == generate(lm, "The cat", 8)
    assert generate(lm, "The cat", 8, temperature=1.0, top_k=1) == greedy  # top-1 sampling is greedy
    assert generate(lm, "The cat", 8, temperature=1.0, top_p=1e-6) == greedy  # so is the tiniest nucleus
    a = [generate(lm, "The cat", 8, temperature=2.0, seed=s) for s in range(4)]
    assert a == [generate(lm, "The cat", 8, temperature=2.0, seed=s) for s in range(4)] and len(set(a)) > 1
    assert isinstance(generate(lm, "", 5), str)  # an empty prompt starts from <|endoftext|>


def test_the_lineage_cli_names_each_stage_validation_and_refuses_an_unknown_metric(tmp_path, capsys):
    from tasks.evaluate.provenance import main
    results = {"rows": [{"task": "boolq", "shots": 0, "metric": "acc", "value": 0.5, "n": 4}],
               "provenance": {"git": {"commit": "abc", "dirty": False}, "params_sha256": "f00",
                              "checkpoint": {"path": "ck", "step": 2, "tokens": 64}, "prefect_flow_run_id": None,
                              "dvc_lock": {"sample": {"data/sample/corpus": "m1"}, "extract": {"data/extract/shards": "m2"},
                                           "filter": {"data/filter/shards": "m3"}},
                              "validation": {"sample": {"success": None}, "extract": {"success": True},
                                             "filter": {"success": False}}}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main([str(tmp_path / "results.json"), "boolq", "acc"]) == 0
    out = capsys.readouterr().out
    assert "boolq 0-shot acc = 0.5000 (n=4)" in out
    assert "data: sample data/sample/corpus md5 m1; validation not recorded (no suite)" in out
    assert "data: extract data/extract/shards md5 m2; validation passed" in out
    assert "data: filter data/filter/shards md5 m3; validation FAILED" in out
    assert main([str(tmp_path / "results.json"), "boolq", "nosuch"]) == 2
    assert "no metric 'nosuch' in" in capsys.readouterr().err


def test_a_model_the_train_stage_did_not_make_is_cited_without_the_pipelines_data_lineage(tmp_path, lm):
    """`python -m tasks.evaluate.run` on a Hugging Face GPT-2 (or the schedule on work.previous/'s checkpoints)
    cited every dvc.lock hash with "validation passed", and "step None, None training tokens"."""
    from tasks.evaluate.provenance import cited_for, current_run, lineage
    prov = {"git": {"commit": "abc", "dirty": False}, "params_sha256": "f00", "prefect_flow_run_id": None,
            "dvc_lock": {"dedup": {"data/dedup/shards": "m1"}}, "dvc_lock_left_out": [],
            "validation": {"dedup": {"success": True}}}
    assert current_run(tmp_path) == ""
    (tmp_path / "train" / "work").mkdir(parents=True)
    (tmp_path / "train" / "work" / "identity").write_text("run-a", encoding="utf-8")
    asked = {**prov, "train_run": current_run(tmp_path)}
    assert cited_for(asked, "run-a", Path("ck")) == asked  # a checkpoint of the current run: its lineage
    assert cited_for(prov, None, Path("ck")) == prov  # the evaluate stage's own model (no train_run asked)
    assert lm.run is None  # (a Hugging Face folder records no run)
    for run, what in ((None, "a Hugging Face folder"), ("run-b", "a checkpoint of another training run")):
        cited = cited_for(asked, run, Path("m"))
        assert cited["dvc_lock"] == {} and cited["validation"] == {}
        lines = lineage({"rows": [], "provenance": {**cited, "checkpoint": {"path": "m", "step": None, "source": "hf"}}})
        assert f"data: unknown (m is {what}: the pipeline's data lineage is not its own)" in lines
        assert "model: m (hf)" in lines and not any("md5" in line for line in lines)


def test_the_lineage_names_a_stage_left_out_of_dvc_lock_instead_of_citing_its_old_hashes(tmp_path, copied_sources):
    """A stage whose code changed while the pipeline ran is left out of dvc.lock; its lock entry is an
    earlier run's, and the evaluation cited it as this model's data."""
    import yaml

    from tasks.core import registry, source
    from tasks.evaluate.provenance import collect, lineage
    for stage in ("sample", "extract"):  # loaded as the pipeline run starts
        source.loaded_code_digest(registry.stage(stage).code)
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"stages": {
        "sample": {"outs": [{"path": "data/sample/corpus", "md5": "old"}]},
        "extract": {"outs": [{"path": "data/extract/shards", "md5": "m2"}]}}}))
    stage_py = copied_sources / "tasks" / "sample" / "stage.py"
    stage_py.write_text(stage_py.read_text() + "\nCHANGED = 1\n")
    prov = collect(tmp_path, tmp_path / "data", {}, {"path": "ck", "step": 1, "tokens": 8})
    assert prov["dvc_lock"] == {"extract": {"data/extract/shards": "m2"}} and prov["dvc_lock_left_out"] == ["sample"]
    lines = lineage({"rows": [], "provenance": prov})
    assert "data: sample not recorded in dvc.lock: its code changed while the run was under way" in lines
    assert not [x for x in lines if "md5 old" in x]


def test_the_stage_warns_of_few_shot_prompts_cut_to_the_window(tmp_path):
    from tasks.core.config import parse_params
    from tasks.evaluate.stage import warnings
    p = parse_params({"paths": {"data_dir": str(tmp_path / "data")}})
    assert warnings({}, p) == []  # no results (yet)
    results = tmp_path / "data/evaluate/results/results.json"
    results.parent.mkdir(parents=True)
    row = {"task": "lambada", "shots": 15, "metric": "acc", "value": 0.1, "stderr": 0.1, "n": 40, "skipped": 0}
    results.write_text(json.dumps({"rows": [{**row, "cut": 39}, {**row, "shots": 0, "cut": 0}]}))
    assert warnings({}, p) == ["few-shot prompts cut to the model's window, their shots lost, so these scores are not "
                               "k-shot ones: lambada 15-shot (39 of 40)"]


def test_the_lineage_cli_refuses_what_is_not_a_results_file_in_one_line(tmp_path, capsys):
    from tasks.evaluate.provenance import main
    (tmp_path / "params.yaml").write_text("paths: {}\n")
    (tmp_path / "other.json").write_text('{"a": 1}')
    for path, line in ((tmp_path / "nosuch.json", "no such file (an evaluation's results.json)"),
                       (tmp_path, "a folder, not an evaluation's results.json"),
                       (tmp_path / "params.yaml", "not JSON (Expecting value: line 1 column 1 (char 0))"),
                       (tmp_path / "other.json", "not an evaluation's results.json (it has no rows)")):
        assert main([str(path), "boolq", "acc"]) == 2
        assert capsys.readouterr().err == f"input file error: {path}: {line}\n"
