"""Typed configuration: params.yaml -> pydantic models.

The same models are the Prefect flow parameters (the UI renders them as forms) and the
arguments of every stage core, so there is exactly one place a parameter is defined.
Every model forbids unknown keys: a typo in params.yaml is an error, never a silent default.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from tasks.core.errors import ConfigError
from tasks.core.strict import PathText, Strict  # noqa: F401  (Strict re-exported: every section derives from it)
from tasks.dedup.config import DedupParams
from tasks.evaluate.config import EvaluateParams
from tasks.filter.config import FilterParams
from trainer.config import TrainStageParams




class PathsParams(Strict):
    data_dir: PathText = Field("data", description="Root of all stage outputs (one folder per stage).")
    benchmarks_dir: PathText = Field(
        "../shared/benchmarks",
        description="Folder with the official evaluation-task files (see README).",
    )
    docs_url: str = Field(
        "http://127.0.0.1:4201", pattern=r"^https?://[^\s]+$",
        description="The Data Docs link in artifacts; `make docs` and `make ui` serve the docs folder under data_dir at its port (flows.docs_server).",
    )


class RunnerParams(Strict):
    """How shards run in parallel. `python -m tasks` (and so `dvc repro`) runs them in max_workers threads
    (one after another for sequential); processes and dask apply to the Prefect flows."""

    kind: Literal["sequential", "threads", "processes", "dask"] = Field(
        "threads", description="How a stage's shards run: in order, on threads, in processes, or on a Dask cluster.")
    max_workers: int = Field(2, ge=1, le=512, description="Shards at once (threads or processes).")
    dask_address: str | None = Field(
        None, description="tcp://host:port of an existing Dask scheduler (kind=dask)."
    )


class SampleParams(Strict):
    """The built-in mini-crawl: a deterministic stand-in for Common Crawl + curated sets."""

    seed: int = Field(1234, ge=0, lt=2**32, description="Seed of the generated sample crawl.")
    crawl_id: str = Field("CC-MAIN-2020-50", pattern=r"^CC-MAIN-\d{4}-\d{2}$",
                          description="The snapshot the sample's WARC files name.")
    n_warc_files: int = Field(4, ge=1, le=1000, description="Generated WARC files.")
    pages_per_warc: int = Field(60, ge=1, le=100_000, description="Pages in each generated WARC file.")
    curated_docs_per_dataset: int = Field(40, ge=1, le=1_000_000,
                                          description="Documents of each generated curated dataset.")


class CuratedSource(Strict):
    path: PathText = Field(description="A Pile-style .jsonl (.gz, .zst), .json.gz/.zst or .parquet file, or a glob of them.")
    dataset: str | None = Field(
        None, description="Tag for every document; default: meta.pile_set_name of each line."
    )
    text_field: str = Field(
        "text", min_length=1, description="The key (JSON lines) or column (Parquet) holding the document's "
        "text: `content` for The Stack, `raw_content` for RedPajama-V2.",
    )


class DownloadParams(Strict):
    source: Literal["sample", "commoncrawl"] = Field(
        "sample",
        description="sample: serve data/sample/corpus on 127.0.0.1 and download it over real HTTP.",
    )
    base_url: str = Field("https://data.commoncrawl.org", pattern=r"^https?://[^\s]+$",
                          description="Where the crawl's files are served (Common Crawl's, or a mirror).")
    crawl_id: str | list[str] = Field(
        "CC-MAIN-2020-50", description="A Common Crawl snapshot, or a list of them (MT-NLG blends CC-MAIN-2020-50 and "
                                       "CC-MAIN-2021-04): n_files of each.")
    n_files: int = Field(4, ge=1, le=100_000, description="WARC files taken from each snapshot's listing.")
    selection: Literal["first", "random"] = Field(
        "random", description="first: the head of the listing; random: a seeded sample of it.")
    seed: int = Field(0, ge=0, lt=2**32, description="Seed of the random selection.")
    retries: int = Field(5, ge=0, le=20, description="Tries after the first on a 5xx, connection or TLS error.")
    backoff_s: float = Field(0.5, ge=0, le=60, description="First wait before a retry (doubled each time).")
    backoff_max_s: float = Field(30.0, ge=0, le=600, description="Longest wait between retries.")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="Seconds without a byte before a transfer is retried.")
    max_failed_fraction: float = Field(
        0.01, ge=0, le=1,
        description="WARC files that are gone or still broken after retries are skipped and listed in "
                    "stats.json (failed_files); more than this fraction of the listed WARC files fails the stage.")
    curated: list[CuratedSource] = Field(
        default_factory=list,
        description="Local curated datasets; in sample mode the sample's own are added.",
    )


    @field_validator("crawl_id")
    @classmethod
    def _crawls(cls, v):
        ids = [v] if isinstance(v, str) else v
        bad = [c for c in ids if not re.fullmatch(r"CC-MAIN-\d{4}-\d{2}", c)]
        if not ids or bad:
            raise ValueError(f"a Common Crawl snapshot is named CC-MAIN-YYYY-WW, got {bad[0] if bad else 'no snapshot'!r}")
        if len(set(ids)) < len(ids):
            raise ValueError(f"a snapshot is listed twice: {sorted(c for c in ids if ids.count(c) > 1)[0]}")
        return v

    def crawls(self) -> list[str]:
        return [self.crawl_id] if isinstance(self.crawl_id, str) else list(self.crawl_id)


class ExtractParams(Strict):
    extractor: Literal["resiliparse", "trafilatura"] = Field("resiliparse", description="The main-text extractor.")
    time_limit_s: float = Field(5.0, gt=0, le=600, description="Per-document extraction limit.")
    max_html_bytes: int = Field(4_000_000, ge=1024, description="Larger payloads are skipped.")
    min_text_chars: int = Field(1, ge=0, description="Pages with less text are dropped (empty_text).")
    lang_chars: int = Field(1000, ge=100, description="Characters fed to language ID.")
    lang_min_chars: int = Field(200, ge=0, description="Shorter texts get lang 'unknown', not a guess.")
    lang_min_confidence: float = Field(
        0.5, ge=0, le=1, description="Below this language-ID confidence (fastText's probability, lang_score) "
                                     "lang is 'unknown' (CCNet's 0.5).")


TaskName = Literal["lambada", "boolq", "race_h", "piqa", "hellaswag", "winogrande", "anli_r2", "hans", "wic"]


class DecontamParams(Strict):
    """GPT-3 App. C / MT-NLG n-gram decontamination against the evaluation tasks."""

    input_stage: Literal["extract", "dedup"] = Field("dedup", description="Stage whose shards are decontaminated.")
    tasks: list[TaskName] = Field(
        default_factory=lambda: ["lambada", "boolq", "race_h", "piqa", "hellaswag", "winogrande",
                                 "anli_r2", "hans", "wic"], min_length=1,
        description="Evaluation tasks whose n-grams are removed.")
    n: int = Field(13, ge=5, le=50, description="N-gram length in words.")
    min_n: int = Field(8, ge=1, le=50, description="Shorter task texts count whole, down to this length.")
    max_doc_frequency: int = Field(10, ge=1, description="N-grams in more training docs are ignored.")
    margin_chars: int = Field(200, ge=0, description="Removed on each side of a match.")
    min_piece_chars: int = Field(200, ge=0, description="Shorter pieces of a split document are dropped.")
    max_pieces: int = Field(10, ge=1, description="A document split into more pieces is dropped.")
    batch_docs: int = Field(1000, ge=1, le=100_000, description="Documents per batch.")

    @field_validator("min_n")
    @classmethod
    def _min_n_le_n(cls, v: int, info) -> int:
        if v > info.data.get("n", 13):
            raise ValueError("min_n must be <= n")
        return v


class BlendEntry(Strict):
    dataset: str = Field(min_length=1, description="A value of the documents' `dataset` column.")
    weight: float = Field(ge=0, description="Sampling weight (normalised over the blend; 0 leaves it out).")


class TokenizeParams(Strict):
    """Byte-level BPE, Megatron .bin/.idx datasets per `dataset`, and the weighted blend (MT-NLG)."""

    input_stage: Literal["decontaminate"] = Field("decontaminate", description="Stage whose shards are tokenized.")
    tokenizer_file: PathText = Field("", description="tokenizer.json, or GPT-2 vocab.json (with merges_file); "
                                                "empty: train a byte-level BPE on the input.")
    merges_file: PathText = Field("", description="GPT-2 merges.txt beside tokenizer_file's vocab.json.")
    vocab_size: int = Field(50257, ge=257, le=2**31 - 1, description="Vocabulary of a trained tokenizer (GPT-2: 50257).")
    min_frequency: int = Field(2, ge=1, description="A pair seen fewer times is not merged (training).")
    train_max_docs: int = Field(0, ge=0, description="Documents the tokenizer trains on (0: all).")
    batch_docs: int = Field(1000, ge=1, le=100_000, description="Documents per encode_batch call.")
    seq_length: int = Field(2048, ge=2, description="Tokens per training sample (samples hold seq_length + 1).")
    train_tokens: int = Field(270_000_000_000, ge=1, description="Training token budget (MT-NLG: 270B).")
    seed: int = Field(1234, ge=0, lt=2**32, description="Seed of the document and sample shuffles.")
    profile: Literal["custom", "mt-nlg"] = Field(
        "custom", description="custom: the weights in `blend`; mt-nlg: MT-NLG's 15-dataset table (blend left empty).")
    blend: list[BlendEntry] = Field(
        default_factory=list,
        description="Weight per dataset (epochs are derived from the token budget); empty: every dataset, "
                    "weighted by its tokens (one epoch each at a budget equal to the corpus).")

    @model_validator(mode="after")
    def _unique_datasets(self):
        names = [b.dataset for b in self.blend]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"blend names a dataset twice: {', '.join(dup)}")
        if self.profile == "mt-nlg" and self.blend:
            raise ValueError("profile mt-nlg carries its own weights: leave blend empty")
        if self.merges_file and not self.tokenizer_file:
            raise ValueError("merges_file needs tokenizer_file (the vocab.json beside it)")
        # refused here, not after the tokenizer is trained and every shard tokenized
        if self.blend and not any(b.weight > 0 for b in self.blend):
            raise ValueError("every weight of blend is 0")
        return self


class PipelineParams(Strict):
    paths: PathsParams = Field(PathsParams(), description="Folders: data, benchmarks, the Data Docs link.")
    runner: RunnerParams = Field(RunnerParams(), description="How each stage's shards run.")
    sample: SampleParams = Field(SampleParams(), description="The generated sample crawl (download.source: sample).")
    download: DownloadParams = Field(DownloadParams(), description="Common Crawl WARC files and curated datasets.")
    extract: ExtractParams = Field(ExtractParams(), description="Main text from HTML, with language ID.")
    filter: FilterParams = Field(FilterParams(), description="Heuristic rules and the quality classifier.")
    dedup: DedupParams = Field(DedupParams(), description="Fuzzy deduplication: MinHash, LSH, connected components.")
    decontaminate: DecontamParams = Field(DecontamParams(),
                                          description="13-gram overlaps with the evaluation tasks removed.")
    tokenize: TokenizeParams = Field(TokenizeParams(),
                                     description="BPE tokens, Megatron .bin/.idx datasets and the weighted blend.")
    train: TrainStageParams = Field(TrainStageParams(), description="The GPT: 3D-parallel training profiles.")
    evaluate: EvaluateParams = Field(EvaluateParams(), description="Zero-, one- and few-shot evaluation.")

    def crawl_ids(self) -> list[str]:
        """The Common Crawl snapshots the WARCs come from: the sample's, or download's (real CC file names
        carry timestamps, not the snapshot)."""
        return [self.sample.crawl_id] if self.download.source == "sample" else self.download.crawls()

    @field_validator("runner")
    @classmethod
    def _dask_needs_no_address_unless_dask(cls, v: RunnerParams) -> RunnerParams:
        if v.dask_address and v.kind != "dask":
            raise ValueError("dask_address is only used with kind: dask")
        return v

    def across_sections(self) -> str | None:
        """Why these parameters cannot run, from values of several fields, found before any data (each was
        refused only by the stage that met it: the blend's snapshot after six stages, the profile's context
        length after seven). Not a model validator: the UI's form is validated before the fields it left
        empty take params.yaml's values (flows.stages.filled_from), and it would judge the models' defaults."""
        t = self.tokenize
        if t.train_tokens < t.seq_length:
            return (f"tokenize: train_tokens ({t.train_tokens:,}) is less than one sample of seq_length "
                    f"({t.seq_length:,}) tokens")
        if self.extract.lang_min_chars > self.extract.lang_chars:  # every page 'unknown': the filter drops them all
            return (f"extract: lang_min_chars {self.extract.lang_min_chars} is more than the {self.extract.lang_chars} "
                    f"characters language ID reads (lang_chars): every page would be 'unknown'")
        named = {c.dataset for c in self.download.curated}
        if t.profile == "custom" and None not in named:  # (an unnamed source's names are its data's)
            snapshots = {"CC-" + c.removeprefix("CC-MAIN-") for c in self.crawl_ids()}
            absent = [b.dataset for b in t.blend if re.fullmatch(r"CC-\d{4}-\d{2}", b.dataset)
                      and b.dataset not in snapshots | named]
            if absent:
                return (f"tokenize.blend names {', '.join(absent)}, but the crawl is {', '.join(self.crawl_ids())} "
                        f"(its dataset: {', '.join(sorted(snapshots))})")
        r = self.train.recipe
        if r.seq_len is not None and r.seq_len != t.seq_length:
            return (f"train.profile {self.train.profile!r} is for seq_len {r.seq_len} but the blend's samples hold "
                    f"tokenize.seq_length {t.seq_length} tokens")
        return None

    @model_validator(mode="after")
    def _language_cut_is_reachable(self):
        # extract labels every text under its cut 'unknown', so a lower filter cut changed nothing, silently
        cut, kept = self.extract.lang_min_confidence, self.filter.language.min_score
        if 0 < kept < cut and "unknown" not in self.filter.language.keep:  # keeping unknown, it picks which
            raise ValueError(f"filter.language.min_score {kept} is below extract.lang_min_confidence {cut}: extract "
                             f"labels every text under {cut} 'unknown', so it keeps none of them; lower "
                             f"extract.lang_min_confidence instead")
        return self


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        # a model's own check gets the whole section as its input: the message says what is wrong in it
        got_s = "" if e["type"] == "missing" or isinstance(got, dict) else f" (got {got!r})"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        elif e["type"] == "value_error" and not e["loc"]:  # a check across sections: its message names their keys
            lines.append(e["msg"].removeprefix("Value error, "))
        else:  # a validator's own message, without pydantic's "Value error, " before it
            lines.append(f"{key}: {e['msg'].removeprefix('Value error, ')}{got_s}")
    return "; ".join(lines)


def parse_params(raw: dict, source: str = "params") -> PipelineParams:
    try:
        p = PipelineParams.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(f"{source}: {_format(err)}") from None
    if why := p.across_sections():
        raise ConfigError(f"{source}: {why}")
    return p


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML keeps the last silently), and a key
    that is not a scalar. A merge (`<<: *defaults`) is YAML's own: its keys may be given again after it."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a key is a name, not a "
                                  f"{type(key).__name__}")
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML's) read 010 as 8 (octal) and 1:30 as 90 (base 60): a seed, a count or a step written so
# silently became another number; those forms stay text here, which the models refuse naming the key. Numbers
# are YAML 1.2's: 3e-4 is a float (YAML 1.1 wanted 3.0e-4 and kept `lr: 3e-4` as text).
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"),
    list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def load_params(path: str | Path = "params.yaml") -> PipelineParams:
    """Read and validate a params file; every problem is one ConfigError line naming the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a params file")
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.MarkedYAMLError as err:
        where = f"line {err.problem_mark.line + 1}: " if err.problem_mark else ""
        # PyYAML marks where it noticed the problem, often a line after the one to fix: say where that began
        began = err.context_mark is not None and err.problem and err.context and (
            err.problem_mark is None or err.context_mark.line != err.problem_mark.line)
        context = f" ({err.context} that began on line {err.context_mark.line + 1})" if began else ""
        raise ConfigError(f"{path}: not valid YAML: {where}{err.problem or err.context}{context}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if raw is None:
        raise ConfigError(f"{path}: empty; expected the sections of params.yaml ({', '.join(PipelineParams.model_fields)})")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of stage names")
    return parse_params(raw, str(path))


def dvc_repo_root(start: Path = Path(".")) -> Path | None:
    """The DVC project at `start` (its .dvc/ and dvc.yaml), resolved; None where there is none."""
    return start.resolve() if (start / ".dvc").is_dir() and (start / "dvc.yaml").is_file() else None


def untracked_data_dir(data_dir: str | Path, root: Path) -> str | None:
    """Why DVC cannot record outputs written under `data_dir` for the project at `root`, whose dvc.yaml names
    them data/...: another folder, or a data/ that is a symlink leading out of the repository (DVC records
    nothing outside it); None when it can."""
    data = Path(data_dir).resolve()
    if data != (root / "data").resolve():
        return f"paths.data_dir is {data_dir}, and dvc.yaml's stages read and write {root / 'data'}"
    if not data.is_relative_to(root.resolve()):
        return f"{root / 'data'} leads out of the repository (to {data}), and DVC records nothing outside it"
    return None


def enter_project(params_file: str) -> str:
    """A command naming the params file of a project (the nearest folder above the file with a dvc.yaml) from
    another working directory runs in that project's folder, as `dvc repro` runs its stages: the file's
    relative paths (paths.data_dir, paths.benchmarks_dir), DVC's record and the git commit are read there.
    Run from elsewhere, they were read from the working directory: a new data/ tree there, or an error
    about ../shared/benchmarks naming no folder. Returns the params file's path from the project's folder;
    a file outside any project changes nothing."""
    path = Path(params_file).resolve()
    if not path.is_file():  # load_params names it as given
        return params_file
    project = next((d for d in path.parents if (d / "dvc.yaml").is_file()), None)
    if project is None or project == Path.cwd().resolve():
        return params_file
    os.chdir(project)
    print(f"note: running in {project}, the project of {params_file}: its relative paths are read from there",
          file=sys.stderr)
    return str(path.relative_to(project))
