"""`python -m flows.docs_server [--params params.yaml]`: serve Data Docs (`<paths.data_dir>/docs`) on
127.0.0.1 at the port of `paths.docs_url`, the address the artifacts link to. `make docs` and
`make ui` run it, so the link and the server come from one setting: a port or data folder changed in
params.yaml moves both (a Makefile port beside the params drifted from the link).
"""
from __future__ import annotations

import argparse
import errno
import functools
import sys
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

from tasks.core.config import PipelineParams, load_params
from tasks.core.errors import ConfigError, describe
from tasks.sample.server import LoopbackHTTPServer
from tasks.validation.runner import refresh_index


def docs_address(p: PipelineParams) -> tuple[Path, int]:
    """(the folder to serve, the port) for `paths`; a docs_url without a port is not served here."""
    url = urlsplit(p.paths.docs_url)
    if url.port is None:
        raise ConfigError(f"paths.docs_url {p.paths.docs_url!r} names no port: it points at a server of yours; "
                          f"serve {Path(p.paths.data_dir) / 'docs'} there, or give http://127.0.0.1:<port>")
    return Path(p.paths.data_dir) / "docs", url.port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.docs_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    port = None
    try:
        folder, port = docs_address(load_params(args.params))
        refresh_index(folder)  # sites DVC restored (run cache, checkout) had no validation to list them
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
        server = LoopbackHTTPServer(("127.0.0.1", port), handler)
    except Exception as e:  # a taken port or a bad params file: one line (README: exit codes)
        code, line = describe(e)
        if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:  # it named neither the port nor the key
            line += f": port {port} of paths.docs_url is taken (another `make docs`/`make ui`?); free it or change it"
        print(line, file=sys.stderr)
        return code
    print(f"Data Docs: http://127.0.0.1:{port}/index.html (serving {folder})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
