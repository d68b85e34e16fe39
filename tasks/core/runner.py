"""`run_stage(name, params)`: the one entry point every orchestrator calls.

It walks the stage's declared passes in order. `dvc repro` reaches it through `python -m tasks
<stage>`, Prefect through flows/, both with the same params model; only the way a sharded pass's
shards are mapped differs (in threads for the command, tasks.core.shard_threads; through a Prefect task
runner in flows/; one after another by default here).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from tasks.core import registry
from tasks.core.config import PipelineParams, dvc_repo_root, untracked_data_dir
from tasks.core.errors import CodeChanged, PipelineError, StageBusy, StageFailed, UnfinishedInput
from tasks.core.identity import done_marker, input_names, input_stat, read_json, recorded_for
from tasks.core.passes import (PassLayout, Shard, atomic_write_text, digest, merge_stats, prune, remove_leftovers,
                               run_global, run_shard, shards_digest)
from tasks.core.source import changed_since_loaded, loaded_code_digest
from tasks.core.stage import (Context, GlobalPass, ShardedPass, Stage, changed_input, check_input_passes,
                              check_input_shards, input_shard_files)
from tasks.core.uptodate import DeclaredInputs, outputs_digest, stage_key, up_to_date

VALIDATION_CODE = "tasks/validation"  # every suite and what they share: part of a validated stage's key

MapShards = Callable[[str, str, PipelineParams, list[Shard], Context], list[dict]]


def process_shard(stage: str, pass_name: str, p: PipelineParams, shard: Shard, ctx: Context) -> dict:
    """Run one shard of a sharded pass (picklable: process and Dask workers call this too)."""
    st = registry.stage(stage)
    ps = st.pass_named(pass_name)
    layout = PassLayout(st.pass_root(p.paths.data_dir, ps))
    recorded_for(ctx.run, ctx.data_dir)
    with naming_changed_input(ctx, lambda: shard.inputs):
        return run_shard(layout, shard, lambda s, tmp: ps.process(s, tmp, p, ctx), ps.params(p), p.paths.data_dir,
                         ctx.upstream())


@contextlib.contextmanager
def naming_changed_input(ctx: Context, files: Callable[[], list]) -> Iterator[None]:
    """A pass that fails on an input shard whose bytes changed since it was written fails with that
    shard named (exit 4) instead of the decoder's message (`ZSTD decompression failed`)."""
    try:
        yield
    except PipelineError:  # already names its cause
        raise
    except Exception as e:
        changed = changed_input(ctx, files())
        if changed is not None:
            raise changed from e
        raise


def map_sequential(stage: str, pass_name: str, p: PipelineParams, shards: list[Shard], ctx: Context) -> list[dict]:
    return [process_shard(stage, pass_name, p, s, ctx) for s in shards]


def stats_path(p: PipelineParams, stage: str) -> Path:
    return Path(p.paths.data_dir) / stage / "stats.json"


def require_complete(p: PipelineParams, stage: str, needed_by: str) -> None:
    """A stage's stats.json is removed when it starts and written when it ends: its presence is
    what "completed" means, so no stage ever reads a half-finished input."""
    path = stats_path(p, stage)
    if not path.is_file():
        raise UnfinishedInput(f"stage '{needed_by}' needs stage '{stage}' completed "
                              f"({path} missing): run `python -m tasks {stage}` first")
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stats = None
    if not isinstance(stats, dict):  # edited by hand, or cut: it said "JSONDecodeError: Expecting ...", naming no file
        raise UnfinishedInput(f"stage '{needed_by}' needs stage '{stage}' completed ({path} is not a stage's "
                              f"stats): rerun `python -m tasks {stage}`")
    validation = stats.get("validation") or {}
    if validation.get("success") is False:
        raise UnfinishedInput(f"stage '{needed_by}' needs stage '{stage}' to pass its validation (see {path}): "
                              f"fix it and rerun `python -m tasks {stage}`")
    if validation.get("pending"):
        raise UnfinishedInput(f"stage '{needed_by}' needs stage '{stage}' validated, and its validation did not "
                              f"finish (interrupted?): rerun `python -m tasks {stage}`")


@contextlib.contextmanager
def stage_lock(p: PipelineParams, name: str) -> Iterator[None]:
    """Held by the CLI and the flows for a stage's run and validation: the stage's own folder
    exclusively, its input stage's shared. A second run of the stage, or a run of its input stage while
    it reads that input, stops at once with one line, instead of deleting the first run's temporary
    files or changing its input underneath it. (flock: released when the process dies, even by kill -9.)"""
    held = []
    try:
        for stage, mode in ((name, fcntl.LOCK_EX), (registry.stage(name).input(p), fcntl.LOCK_SH)):
            if stage is None:
                continue
            folder = Path(p.paths.data_dir) / stage
            folder.mkdir(parents=True, exist_ok=True)
            fh = open(folder / ".lock", "a+")
            try:
                fcntl.flock(fh, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                what = ("it is running already, or a stage reading it as input is" if stage == name
                        else f"its input stage '{stage}' is running")
                raise StageBusy(f"stage '{name}' cannot start: {what}, in {p.paths.data_dir}") from None
            held.append(fh)
        if dvc_lock := _dvc_repo_lock(p):
            held.append(dvc_lock)
        yield
    finally:
        for fh in held:
            fh.close()


def _dvc_repo_lock(p: PipelineParams):
    """DVC's repository lock (.dvc/tmp/lock), shared, while a stage writes the outputs dvc.yaml tracks. `dvc
    repro` deletes a stage's outputs before its command runs, so a `dvc repro -f -s tokenize` beside a running
    train took the tokenizer from under it before the stage's own lock could refuse; DVC takes this lock
    first (exclusive, zc.lockfile's flock) and now stops with its "Unable to acquire lock" instead. Stages
    can share it, and `dvc repro`'s own stages can take it: DVC lets go of it while a stage's command runs.
    None where DVC tracks nothing of this run (another data_dir), or with no .dvc/ here."""
    root = dvc_repo_root()
    if root is None or untracked_data_dir(p.paths.data_dir, root):
        return None
    try:
        (root / ".dvc" / "tmp").mkdir(exist_ok=True)
        fh = open(root / ".dvc" / "tmp" / "lock", "a+")
    except OSError:  # a read-only checkout: DVC cannot run there either
        return None
    try:
        fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise StageBusy(f"a DVC command is running in {root} (it holds .dvc/tmp/lock): wait for it, "
                        "then rerun") from None
    except OSError:  # a file system without flock: as for the stage locks' folders, no lock
        fh.close()
        return None
    return fh


def _run_sharded(st: Stage, ps: ShardedPass, p: PipelineParams, ctx: Context, map_shards: MapShards,
                 declared: DeclaredInputs, changing: Callable[[], None]):
    layout = PassLayout(st.pass_root(p.paths.data_dir, ps))
    layout.prepare()
    shards = ps.plan(p, ctx)
    # each input once: every shard of dedup's bucket pass lists every signature file
    declared.check(ps.name, dict.fromkeys(i for s in shards for i in s.inputs))
    changing()  # the shards are committed by the workers, each as it finishes: before the first of them
    parts = map_shards(st.name, ps.name, p, shards, ctx)
    prune(layout, shards)
    failed = [x["failed"] for x in parts if x.get("failed")]
    fallible = sum(map(ps.fallible, shards))
    if failed and len(failed) > ps.max_failed(p) * fallible:
        raise StageFailed(f"stage '{st.name}': {len(failed)} of {fallible} shards failed (at most "
                          f"{ps.max_failed(p):.1%} may): " + "; ".join(f"{f['shard']}: {f['reason']}" for f in failed[:3])
                          + (f"; and {len(failed) - 3} more" if len(failed) > 3 else ""))
    summary = {"kind": "sharded", "shards": len(shards), "resumed": sum(x.get("resumed", 0) for x in parts),
               "redone_corrupt": sum(x.get("redone_corrupt", 0) for x in parts), "failed": len(failed)}
    return shards, parts, shards_digest(parts, shards), summary


def global_fingerprint(ps: GlobalPass, p: PipelineParams, ctx: Context) -> tuple[list[str], str]:
    """A global pass's inputs and the fingerprint its marker must hold for its output to be reused."""
    inputs = ps.inputs(p, ctx)
    return inputs, digest([ps.params(p), input_names(inputs, p.paths.data_dir), input_stat(inputs), ctx.upstream()])


def global_pass_marked_done(st: Stage, ps: GlobalPass, p: PipelineParams, ctx: Context) -> bool:
    """Whether the stage's first pass, a global one, finds its marker for these params and inputs (a
    stage's check can then leave out refusals only a rebuild meets: the run reuses the output, unless
    its files changed since). `ctx`: the check's, which carries the stage's code."""
    if ps is not st.passes[0]:
        raise ValueError(f"stage {st.name}: {ps.name} is not its first pass")
    out = st.pass_root(p.paths.data_dir, ps)
    done = read_json(done_marker(out))
    return bool(done) and out.is_dir() and done.get("fingerprint") == global_fingerprint(ps, p, ctx)[1]


def _run_global(st: Stage, ps: GlobalPass, p: PipelineParams, ctx: Context, declared: DeclaredInputs,
                changing: Callable[[], None]):
    out = st.pass_root(p.paths.data_dir, ps)
    inputs, fp = global_fingerprint(ps, p, ctx)
    declared.check(ps.name, inputs)
    with naming_changed_input(ctx, lambda: input_shard_files(ctx)):
        res = run_global(out, done_marker(out), lambda tmp: ps.build(tmp, p, ctx), fp,
                         before_change=changing)
    summary = {"kind": "global", "resumed": res["resumed"], "redone_corrupt": res.get("redone_corrupt", 0)}
    return res["report"], res["digest"], summary


def run_stage(name: str, p: PipelineParams, map_shards: MapShards = map_sequential,
              validation_follows: bool = False, skip_up_to_date: bool = True) -> dict:
    """Run the stage's passes and write its stats.json. `validation_follows`: the caller validates the
    output next (the CLI, the Prefect flows), so stats.json says the validation is pending until it is
    recorded, and a run killed in between is not taken as a validated input.

    A stage found up to date (tasks.core.uptodate) is not run: its stats.json stays as it is, and what is
    returned is that, with `up_to_date: true`. `skip_up_to_date=False` walks the passes all the same (each
    resumes where its markers allow): for a check of the intermediate passes."""
    st = registry.stage(name)
    input_stage = st.input(p)
    before = Context(name, str(p.paths.data_dir), input_stage)
    # refusals come before anything of this stage changes: a refused run leaves it as it was
    if input_stage is not None:
        require_complete(p, input_stage, name)
    code = loaded_code_digest(st.code)
    if changed_since_loaded(st.code):  # its code not yet imported would be the new one: a mix, never recorded
        raise CodeChanged(f"stage '{name}' cannot start: its code changed on disk after this run loaded it, and "
                          f"it would run a mix of old and new code: rerun")
    run = uuid.uuid4().hex
    recorded_for(run, p.paths.data_dir)
    other = st.other_inputs(p, before)
    suites = loaded_code_digest((VALIDATION_CODE,)) if st.suite is not None else ""
    source = registry.stage(input_stage) if input_stage else None
    key = stage_key(st, p, replace(before, code=f"{code}+{suites}"), source, other)
    root = Path(p.paths.data_dir) / name
    if skip_up_to_date and (kept := up_to_date(st, stats_path(p, name), key, p.paths.data_dir)) is not None:
        _restore_plots(st, root, kept)
        return {**kept, "up_to_date": True}
    # refusals only a run needs, since a stage found up to date reads nothing: the input checked file by file
    # against its markers (a global input, a blend or a checkpoint, is hashed whole: at scale, terabytes on
    # every pipeline run) and the stage's own check (evaluate parses every task file)
    if input_stage is not None and not st.input_is_remote:
        if isinstance(source.output_pass(), ShardedPass):
            check_input_shards(before)  # a shard missing, changed, or not the input stage's
        else:
            check_input_passes(before, source)
    if st.check is not None:
        st.check(p, replace(before, code=code))
    declared = DeclaredInputs(st, p.paths.data_dir, input_stage, other, lambda: st.other_inputs(p, before))
    root.mkdir(parents=True, exist_ok=True)
    # not complete from the first change to its outputs until this run writes stats.json again; a run
    # refused before that (a pass's own refusal, before it commits anything) leaves the last completion
    changing = functools.partial(stats_path(p, name).unlink, missing_ok=True)  # each pass calls it: idempotent
    remove_leftovers(root)
    start = time.perf_counter()
    passes, reports, docs = [], {}, None
    with st.environment(p) as env:
        ctx = Context(name, str(p.paths.data_dir), input_stage, env=env, code=code, run=run)
        for ps in st.passes:
            t0 = time.perf_counter()
            if isinstance(ps, ShardedPass):
                shards, parts, dig, summary = _run_sharded(st, ps, p, ctx, map_shards, declared, changing)
                docs = (shards, parts)  # the last sharded pass's documents are the stage's counts
            else:
                report, dig, summary = _run_global(st, ps, p, ctx, declared, changing)
                reports.update(report)
            passes.append({"name": ps.name, **summary, "seconds": round(time.perf_counter() - t0, 3)})
            ctx = replace(ctx, digests={**ctx.digests, ps.name: dig})
    stats = {"stage": name, "passes": passes, **reports}
    if docs is not None:
        shards, parts = docs
        stats.update(shards=len(shards), **merge_stats(parts))
        stats["resumed_shards"] = sum(x.get("resumed", 0) for x in parts)
        stats["redone_corrupt"] = sum(x.get("redone_corrupt", 0) for x in parts)
        stats["failed_shards"] = [x["failed"] for x in parts if x.get("failed")]
    stats["wall_seconds"] = round(time.perf_counter() - start, 3)
    if st.report is not None:  # stage-specific summary computed from the merged totals
        stats.update(st.report(stats))
    if st.warnings is not None and (warnings := st.warnings(stats, p)):
        stats["warnings"] = warnings
    _restore_plots(st, root, stats)
    stats["fingerprint"] = {"stage": key, "outputs": outputs_digest(st, p.paths.data_dir)}
    if validation_follows and st.suite is not None:
        stats["validation"] = {"success": None, "pending": True}
    atomic_write_text(stats_path(p, name), json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return stats


def _restore_plots(st: Stage, root: Path, stats: dict) -> None:
    """The files made from the stats (for `dvc plots`), written where they differ or are missing."""
    for rel, text in (st.plot_files(stats) if st.plot_files is not None else {}).items():
        path = root / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            atomic_write_text(path, text)


def adopt_outputs(p: PipelineParams, stage: str) -> dict:
    """Declare shards placed in a stage's output folder by hand (documents made elsewhere, a
    benchmark corpus) to be that stage's completed output, so the stages after it accept them."""
    out = registry.stage(stage).outputs(p.paths.data_dir)
    files = sorted(f.name for f in out.iterdir() if not f.name.startswith(".tmp-")) if out.is_dir() else []
    if not files:
        raise UnfinishedInput(f"stage '{stage}': nothing to adopt in {out}")
    stats = {"stage": stage, "adopted": True, "shards": len(files)}
    atomic_write_text(stats_path(p, stage), json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return stats
