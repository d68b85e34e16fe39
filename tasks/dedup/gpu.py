"""MinHash signatures on a CUDA GPU: a CuPy RawKernel (kernels/cuda/minhash.cu) over the shingle hashes
the CPU pass computes, bit-identical to the CPU signatures (integer arithmetic only). Used by the
signatures pass when `dedup.device` is gpu, or auto and a GPU is present; the CPU path never imports
it. `python -m tasks.dedup.gpu` prints docs/s of both on 500-word documents."""
from __future__ import annotations

import numpy as np

from tasks.dedup.minhash import permutations


def available() -> bool:
    """A CUDA device CuPy can use; asked of CuPy first, so a machine without one never imports torch here."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
    except Exception:  # no CuPy, no driver, no device: CPU
        return False
    from kernels.runtime import fused_available

    return fused_available()


def signatures_gpu(shingles: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int, device=None) -> np.ndarray:
    """[documents, num_perm] uint32: the same values as tasks.dedup.minhash.signatures_of. `device`: the
    current CUDA device unless given (tests/test_kernels_emulated.py gives the CPU, under the emulator)."""
    import torch

    from kernels import runtime

    docs = len(offsets) - 1
    if docs == 0:
        return np.zeros((0, num_perm), dtype=np.uint32)
    a, b = permutations(num_perm, seed)
    dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
    as_i32 = lambda x: torch.from_numpy(np.ascontiguousarray(x).view(np.int32)).to(dev)  # noqa: E731  (bits as is)
    h = as_i32(shingles if len(shingles) else np.zeros(1, np.uint32))
    off = torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64)).to(dev)
    sig = torch.empty((docs, num_perm), dtype=torch.int32, device=dev)
    runtime.launch("minhash.cu", "minhash_signatures", (docs, 1, 1), (min(num_perm, 1024), 1, 1),
                   (h, off, as_i32(a), as_i32(b), sig, runtime.i32(num_perm)))
    return sig.cpu().numpy().view(np.uint32)


def _benchmark(docs: int = 20_000) -> None:
    import time

    from tasks.dedup.fused import sign_words
    from benchmarks.dedup_corpus import corpus

    texts = [d["text"] for d in corpus(docs, 500, 1)[0]]
    t0 = time.perf_counter()
    sig, _, _, shingles, offsets = sign_words(texts)
    cpu = time.perf_counter() - t0
    signatures_gpu(shingles, offsets[:2], 128, 1)  # compile
    t0 = time.perf_counter()
    _, _, _, sh, off = sign_words(texts, num_perm=0)  # on the CPU only the shingles
    mid = time.perf_counter()
    gsig = signatures_gpu(sh, off, 128, 1)
    gpu = time.perf_counter() - t0
    print(f"bit-identical: {np.array_equal(sig, gsig)}; text->signature docs/s: cpu {docs / cpu:,.0f}, "
          f"gpu {docs / gpu:,.0f} (of it on the GPU, transfers included: {docs / (time.perf_counter() - mid):,.0f})")


if __name__ == "__main__":
    _benchmark()
