"""params.yaml `evaluate`: which tasks, which shot settings (0, 1 and k per task, as MT-NLG), how many
docs, and the generation samples of the report."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.core.strict import Strict

TaskName = Literal["lambada", "boolq", "race_h", "piqa", "hellaswag", "winogrande", "anli_r2", "hans", "wic"]
ALL_TASKS = ["lambada", "boolq", "race_h", "piqa", "hellaswag", "winogrande", "anli_r2", "hans", "wic"]
# MT-NLG's few-shot k per task (its evaluation table)
MTNLG_K = {"lambada": 15, "boolq": 32, "race_h": 10, "piqa": 50, "hellaswag": 20, "winogrande": 50,
           "anli_r2": 50, "hans": 50, "wic": 50}
# Figure 4 of the MT-NLG blog: arithmetic inference and free completion
FIGURE4_PROMPTS = ["Q: 11 + 23 = ?\nA: 34\nQ: 17 + 45 = ?\nA:", "The capital of France is",
                   "Once upon a time, there was a"]


class GenerationParams(Strict):
    prompts: list[str] = Field(default_factory=lambda: list(FIGURE4_PROMPTS),
                               description="Generated from greedily and by sampling in every report.")
    max_new_tokens: int = Field(32, ge=1, le=4096, description="Tokens generated per prompt.")
    temperature: float = Field(0.8, gt=0.0, description="Sampling temperature (greedy is always shown too).")
    top_k: int = Field(0, ge=0, description="Sample from the k most likely tokens (0: all).")
    top_p: float = Field(0.9, gt=0.0, le=1.0, description="Nucleus: the smallest set with this probability.")
    seed: int = Field(1234, ge=0, lt=2**32, description="Seed of the sampled continuations.")


class EvaluateParams(Strict):
    """Zero-, one- and few-shot evaluation on the MT-NLG tasks, prompts and metrics as lm-evaluation-harness."""

    input_stage: Literal["train"] = Field("train", description="Stage whose final checkpoint is evaluated.")
    tasks: list[TaskName] = Field(default_factory=lambda: list(ALL_TASKS), min_length=1,
                                  description="Tasks evaluated.")
    shots: list[Literal["zero", "one", "few"]] = Field(default_factory=lambda: ["zero", "one", "few"], min_length=1,
                                                       description="Settings: zero-, one- and few-shot (fewshot_k).")
    fewshot_k: dict[TaskName, int] = Field(default_factory=lambda: dict(MTNLG_K),
                                           description="k of the few-shot setting per task (MT-NLG's by default).")
    limit: int | None = Field(None, ge=1, description="Docs per task, drawn with `seed` (None: every doc).")
    seed: int = Field(1234, ge=0, lt=2**32, description="Seed of the subsample and of the few-shot draws.")
    token_budget: int = Field(16384, ge=64, description="Tokens per scoring batch.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when present.")
    generation: GenerationParams = Field(GenerationParams(),
                                         description="Continuations shown in the report (MT-NLG Figure 4).")

    @model_validator(mode="after")
    def _k_for_every_task(self):
        for name, listed in (("tasks", self.tasks), ("shots", self.shots)):
            twice = sorted({x for x in listed if listed.count(x) > 1})
            if twice:  # a task listed twice was scored twice, and its report then failed validation
                raise ValueError(f"{name} lists {', '.join(twice)} twice")
        missing = [t for t in self.tasks if "few" in self.shots and t not in self.fewshot_k]
        if missing:
            raise ValueError(f"fewshot_k has no k for {', '.join(missing)}")
        bad = [f"{t}: {k}" for t, k in self.fewshot_k.items() if k < 1]
        if bad:
            raise ValueError(f"fewshot_k must be >= 1 (got {', '.join(bad)})")
        return self

    def shot_counts(self, task: str) -> list[int]:
        """The k of each setting, each once: a few-shot k of 1 (or 0) is the one-shot (zero-shot) setting, which
        was scored twice, its rows listed twice."""
        return list(dict.fromkeys({"zero": 0, "one": 1, "few": self.fewshot_k.get(task, 0)}[s] for s in self.shots))
