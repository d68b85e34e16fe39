"""numba's `cache=True` compiles a function again when its own source file changes, not when a compiled
function it calls from another file does (a documented limit of numba's cache): after an update that
changed tasks/filter/tokens.py alone, the filter's statistics went on running the old token rules from
the cache. `recompile_when_changed` flushes the caches of a module's compiled functions when the bytes of
the files they call into change."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def recompile_when_changed(dispatchers, depends_on: list[str | Path]) -> None:
    """Flush the on-disk caches of `dispatchers` (numba functions compiled with cache=True) if the files
    `depends_on` are not the ones they were compiled against, and record the files' digest beside them."""
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in depends_on)).hexdigest()
    for d in dispatchers:
        cache = getattr(d, "_cache", None)
        folder = getattr(cache, "_cache_path", None)  # none: numba caches nothing for it (NullCache)
        if folder is None:
            continue
        stamp = Path(folder) / f"{d.py_func.__module__}.{d.py_func.__qualname__}.depends"
        try:
            if stamp.read_text() == digest:
                continue
        except OSError:
            pass
        cache.flush()
        try:  # written whole or not at all: processes importing at once see one digest or the other
            tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
            tmp.write_text(digest)
            os.replace(tmp, stamp)
        except OSError:  # a read-only cache folder: numba caches nothing there either
            pass
