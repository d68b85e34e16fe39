"""How a stage is declared: a name, its params section, its input stage, and an ordered list of
passes. The runner (tasks.core.runner) walks any stage the same way; nothing is probed.

    Stage("decontaminate", section="decontaminate", input=from_params(...),
          passes=(GlobalPass("index", ...), ShardedPass("count", ...),
                  GlobalPass("frequent", ...), ShardedPass("remove", ...)))

The **last** pass is the stage's output: a sharded last pass writes `data/<stage>/shards/` (the
DVC `outs`), a global last pass writes `data/<stage>/<pass>/`. Earlier sharded passes write under
`data/<stage>/<pass>/shards/`. Every pass is resumable and fingerprinted (tasks.core.passes).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Mapping, Union

from tasks.core.config import PipelineParams
from tasks.core.passes import Shard, ShardStats


@dataclass(frozen=True)
class Context:
    """What a pass sees besides the parameters: where things are, what the stage's environment
    provides (e.g. the URL the sample is served on), and the content digests of the passes that
    already finished in this run. Plain data, so process and Dask workers receive it too."""

    stage: str
    data_dir: str
    input_stage: str | None = None
    env: Mapping = field(default_factory=dict)
    digests: Mapping[str, str] = field(default_factory=dict)
    code: str = ""  # the digest of the stage's source folders (tasks.core.source)
    run: str = ""  # this stage run's id (what workers keep of markers they read lasts one run)

    @property
    def root(self) -> Path:
        return Path(self.data_dir) / self.stage

    @property
    def input_shards(self) -> Path:
        """The input stage's output shards."""
        if self.input_stage is None:
            raise ValueError(f"stage {self.stage!r} has no input stage")
        return Path(self.data_dir) / self.input_stage / "shards"

    def pass_dir(self, name: str) -> Path:
        """The folder of an earlier pass: a global pass's output, or a sharded pass's
        shards/ + completions/ (the stage's output pass writes to the stage folder itself)."""
        return self.root / name

    def upstream(self) -> str:
        """What the current pass depends on besides its params and inputs (part of its fingerprint): the
        stage's code, and the digest of every pass finished before it."""
        code = [f"code={self.code}"] if self.code else []
        return ",".join(code + [f"{k}={v}" for k, v in self.digests.items()])


def shard_per_file(files, suffix: str | None = None) -> list[Shard]:
    """One shard per input file, named by its stem; the output keeps the file's name, or takes
    `<stem><suffix>` (e.g. ".npz" for a pass that writes arrays). The plan of most sharded passes."""
    return [Shard(f.stem, (str(f),), f"{f.stem}{suffix}" if suffix else f.name) for f in files]


def input_shard_files(ctx: "Context") -> list[Path]:
    """Every file of the input stage's output, in name order (hidden files, such as .tmp- leftovers,
    .DS_Store or NFS .nfsXXXX, are no shards). The runner has checked them (check_input_shards)."""
    folder = ctx.input_shards
    return sorted(f for f in folder.iterdir() if not f.name.startswith(".")) if folder.is_dir() else []


def check_input_shards(ctx: "Context") -> None:
    """The input stage's files against that stage's completion markers: a shard missing, of another
    size than it was written, or written by no run of that stage stops this one with one line naming
    it (a stage must never read part of its input). The markers are a DVC output beside the shards
    (dvc.yaml), so a `dvc checkout` or a run-cache restore brings back the markers of the shards it
    restores. Outputs adopted by hand (runner.adopt_outputs) have no markers and are taken as they are."""
    from tasks.core.errors import UnfinishedInput
    from tasks.core.passes import PassLayout, written_outputs

    folder = ctx.input_shards
    layout, stats = PassLayout(folder.parent), folder.parent / "stats.json"
    if not layout.completions.is_dir() or (stats.is_file() and json.loads(stats.read_text(encoding="utf-8")).get("adopted")):
        return
    written = written_outputs(layout)
    on_disk = {f.name: f.stat().st_size for f in input_shard_files(ctx)}
    rerun = f"rerun `python -m tasks {ctx.input_stage}`"
    for name in sorted(set(written) | set(on_disk)):
        if name not in on_disk:
            raise UnfinishedInput(f"stage '{ctx.stage}': input shard {folder / name} of stage '{ctx.input_stage}' is "
                                  f"missing: {rerun}")
        if name not in written:
            raise UnfinishedInput(f"stage '{ctx.stage}': {folder / name} was not written by stage '{ctx.input_stage}' "
                                  f"(no completion marker): remove it or {rerun}")
        if on_disk[name] != written[name]:
            raise UnfinishedInput(f"stage '{ctx.stage}': input shard {folder / name} has {on_disk[name]} bytes, stage "
                                  f"'{ctx.input_stage}' wrote {written[name]}: {rerun}")


def check_input_passes(ctx: "Context", input_stage: "Stage", names: tuple[str, ...] | None = None) -> None:
    """An input stage whose output is a global pass (tokenize's blend, train's model): every global pass
    of it (or those `names`) against its marker, file by file by sha256 (a checkpoint changed at the same
    size would be evaluated silently otherwise). This reads the input once more; the stages that read it (a
    training run, an evaluation) read it whole anyway. Markers are DVC outputs beside the folders (dvc.yaml).
    `input_stage` may be another stage than the context's input (evaluate reads tokenize's tokenizer too)."""
    from tasks.core.errors import UnfinishedInput
    from tasks.core.identity import done_marker
    from tasks.core.passes import global_output_change

    source = input_stage.name
    stats = Path(ctx.data_dir) / source / "stats.json"
    if stats.is_file() and json.loads(stats.read_text(encoding="utf-8")).get("adopted"):
        return
    for ps in input_stage.passes:
        if isinstance(ps, GlobalPass) and (names is None or ps.name in names):
            out = input_stage.pass_root(ctx.data_dir, ps)
            change = global_output_change(out, done_marker(out))
            if change is not None:
                kind, path = change
                what = {"missing": f"{path} of stage '{source}' is missing",
                        "added": f"{path} was not written by stage '{source}'",
                        "changed": f"{path} changed since stage '{source}' wrote it (its sha256 is not "
                                   f"the one its marker records)"}[kind]
                raise UnfinishedInput(f"stage '{ctx.stage}': {what}: rerun `python -m tasks {source}`")


def changed_input(ctx: "Context", files) -> Exception | None:
    """After a pass failed: the first of `files` in the input stage's output whose bytes are not those
    its completion marker recorded, as the error to raise instead. check_input_shards compares sizes
    only (hashing every input on every run costs a read of it all); a same-size change, e.g. a disk
    error, surfaces as a decoder error naming no file, so the files are hashed then, and only then."""
    from tasks.core.errors import UnfinishedInput
    from tasks.core.passes import PassLayout, file_sha256, written_records

    if ctx.input_stage is None:  # download from a crawl: ctx.input_shards raised, hiding the pass's own error
        return None
    folder = ctx.input_shards
    if not (folder.parent / "completions").is_dir():
        return None
    records = written_records(PassLayout(folder.parent))
    for f in sorted({Path(f) for f in files}):
        r = records.get(f.name)
        if f.parent == folder and r is not None and f.is_file() and file_sha256(f) != r["sha256"]:
            return UnfinishedInput(f"stage '{ctx.stage}': input shard {f} changed since stage '{ctx.input_stage}' "
                                   f"wrote it (same size, other bytes than its completion marker records): "
                                   f"rerun `python -m tasks {ctx.input_stage}`")
    return None


def input_files(ctx: "Context") -> list[Path]:
    """The input stage's Parquet shards, in name order (the order every global index follows)."""
    return [f for f in input_shard_files(ctx) if f.suffix == ".parquet"]


Plan = Callable[[PipelineParams, Context], list[Shard]]
Process = Callable[[Shard, Path, PipelineParams, Context], ShardStats]
Build = Callable[[Path, PipelineParams, Context], dict]
PassParams = Callable[[PipelineParams], dict]


@dataclass(frozen=True)
class ShardedPass:
    """One resumable output per planned shard."""

    name: str
    plan: Plan  # the shards to write (usually one per input shard)
    process: Process  # writes one shard's output to the temp path it is given
    params: PassParams  # what the outputs depend on, for the fingerprint
    # The largest fraction of shards that may fail (raise ShardFailed) without failing the stage, of those
    # `fallible` says can (download's remote files: its local curated files never count as gone, and with
    # them in the total, 1 of 2 WARC files gone passed a bound of 30%).
    max_failed: Callable[[PipelineParams], float] = lambda p: 0.0
    fallible: Callable[[Shard], bool] = lambda shard: True


@dataclass(frozen=True)
class GlobalPass:
    """One atomic output folder computed from everything before it."""

    name: str
    build: Build  # writes into the temp folder it is given; returns its report (stats.json)
    params: PassParams
    inputs: Callable[[PipelineParams, Context], list[str]] = lambda p, ctx: []  # files read besides earlier passes


Pass = Union[ShardedPass, GlobalPass]


@contextlib.contextmanager
def no_environment(p: PipelineParams) -> Iterator[dict]:
    yield {}


def fixed(name: str | None) -> Callable[[PipelineParams], str | None]:
    """An input stage that does not depend on the parameters."""
    return lambda p: name


def absent_datasets(key: str, names, present, effect: str) -> list[str]:
    """Stage.warnings lines for the dataset names a parameter gives that no document has: a misspelt
    name otherwise changes nothing, silently (one shared params file may name more datasets than a run has)."""
    absent = [n for n in names if n not in present]
    return [f"{key} names {n!r}, not a dataset of the input ({', '.join(sorted(present)) or 'none'}): {effect}"
            for n in absent]


@dataclass(frozen=True)
class Stage:
    name: str
    section: str  # its params.yaml section
    doc: str  # one line: what the stage does (the flow's description)
    input: Callable[[PipelineParams], str | None]  # the stage whose shards it reads
    passes: tuple[Pass, ...]
    # its source folders (dvc.yaml's code deps of the stage): a change to them redoes the stage
    code: tuple[str, ...] = ()
    suite: str | None = None  # module of its expectation suite (tasks.validation.<stage>)
    environment: Callable[[PipelineParams], ContextManager[dict]] = no_environment
    report: Callable[[dict], dict] | None = None  # stats.json additions from the merged totals
    # files beside stats.json made from the final stats (relative path -> text): e.g. CSVs for `dvc plots`
    plot_files: Callable[[dict], dict[str, str]] | None = None
    # long work inside one global pass (a training run): its progress while the pass runs, read from
    # what the pass writes, as (fraction done, one line), or None before it has begun; a flow polls it
    progress: Callable[[PipelineParams, float], tuple[float, str] | None] | None = None
    # its outputs cite the dvc.lock hashes of the stages before it: the pipeline records those first
    cites_lineage: bool = False
    # refusals that need no output of this stage (a profile that cannot run, a bad task file): run
    # before the stage's last completion is removed, so a refused run leaves it as it was
    check: Callable[[PipelineParams, Context], None] | None = None
    # what the finished run suggests is a mistake without being wrong (a parameter naming a dataset the
    # data does not have): stats.json `warnings`, printed by the CLI, logged and shown by the flows
    warnings: Callable[[dict, PipelineParams], list[str]] | None = None
    # the passes besides the output pass that DVC keeps (dvc.yaml outs, with their markers): what a `dvc pull`
    # brings back, and what must be whole for the stage to be up to date (tasks.core.uptodate)
    kept: tuple[str, ...] = ()
    # the files it reads besides its input stage's outputs and its own passes' (the task files, a user's
    # tokenizer, model or corpus, another stage's output): part of its key; a pass reading an undeclared one
    # is refused (tasks.core.uptodate.DeclaredInputs)
    other_inputs: Callable[[PipelineParams, Context], list[str]] = lambda p, ctx: []
    # it reads its input over the network (download: the sample stands in for Common Crawl's servers),
    # not from the input's files: the runner does not check them against the input stage's markers. A
    # remote file that fails is the stage's to handle; one that changes after it was fetched is not seen
    # (a crawl's published files never change; README: Download)
    input_is_remote: bool = False

    def __post_init__(self):
        names = [p.name for p in self.passes]
        if not names or len(set(names)) != len(names) or {"shards", "completions"} & set(names):
            raise ValueError(f"stage {self.name}: passes need unique names other than shards/completions")
        if set(self.kept) - set(names[:-1]):
            raise ValueError(f"stage {self.name}: kept names a pass it does not have before its output pass")
        if not self.code:
            raise ValueError(f"stage {self.name}: declare its source folders (code=...)")

    def pass_named(self, name: str) -> Pass:
        return next(p for p in self.passes if p.name == name)

    def output_pass(self) -> Pass:
        return self.passes[-1]

    def pass_root(self, data_dir: str | Path, pass_: Pass) -> Path:
        """A sharded pass's folder (holding shards/ and completions/), or a global pass's output."""
        root = Path(data_dir) / self.name
        if isinstance(pass_, ShardedPass) and pass_ is self.output_pass():
            return root
        return root / pass_.name

    def outputs(self, data_dir: str | Path) -> Path:
        """What the next stage reads (and DVC tracks)."""
        last = self.output_pass()
        return self.pass_root(data_dir, last) / "shards" if isinstance(last, ShardedPass) \
            else self.pass_root(data_dir, last)
