"""Run a function on several gloo ranks (spawned processes on 127.0.0.1) and collect what each returns."""
from __future__ import annotations

from tests.conftest import free_port


def run_ranks(target, world_size: int = 2, timeout: float = 180) -> dict:
    """target(rank, port, queue) must put (rank, result) on the queue; returns {rank: result}."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, port, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
