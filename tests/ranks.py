"""Run a function on several gloo ranks (spawned processes) and collect what each returns."""
from __future__ import annotations

import shutil
import tempfile


def run_ranks(target, world_size: int = 2, timeout: float = 180) -> dict:
    """target(rank, init_method, queue) must put (rank, result) on the queue; returns {rank: result}. The ranks
    meet through a file store: a TCP port found free here could be taken before rank 0 binds it."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    folder = tempfile.mkdtemp(prefix="ranks-")
    queue, init = ctx.Queue(), f"file://{folder}/store"
    procs = [ctx.Process(target=target, args=(r, init, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)
