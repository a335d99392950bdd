"""Compile, once, the bytecode of the packages a build worker imports, into uv's
cache, so that every environment uv makes from that cache starts with it.

`ENV/bin/python scripts/bytecode_in_uv_cache.py UV_CACHE_DIR`, run by
`./dev.sh test` for each torch it tests, compiles those of ENV's packages that
ENV links from the cache (the packages of `WORKER_IMPORTS`), for ENV's Python.

Why: uv installs no bytecode, so each fresh environment's first `import torch`
compiled torch's sources again (1.9 s more CPU than with bytecode), and a build
worker's first import of inductor 5 s more; the tests make about 30 such
environments (deployments, isolated builds, the release legs'). uv links an
installed package's files from its cache (`archive-v0/<entry>/<package>/...`,
hard links on one file system), every file of the entry, and a `.pyc` holds for
any source whose modification time and size it records, which hard links share.
So bytecode written beside the cache's sources reaches each environment linked
from it later. Where uv copies instead, or its layout changes, nothing breaks:
environments compile on import as before.
"""

from __future__ import annotations

import compileall
import sys
import sysconfig
from pathlib import Path

# What `import torch._inductor.compile_fx` loads from site-packages (torch 2.13-2.15).
WORKER_IMPORTS = ("torch", "functorch", "torchgen", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock")


def linked_packages(cache: Path) -> list[Path]:
    """The cache's folders of `WORKER_IMPORTS` that this environment links."""
    site = Path(sysconfig.get_paths()["purelib"])
    cached = {_file_id(init): init.parent for init in cache.glob("archive-v0/*/*/__init__.py")}
    inits = [site / name / "__init__.py" for name in WORKER_IMPORTS]
    return [source for init in inits if init.exists() and (source := cached.get(_file_id(init)))]


def _file_id(path: Path) -> tuple[int, int]:
    """Equal for two names of one file (hard links)."""
    stat = path.stat()
    return stat.st_dev, stat.st_ino


def main() -> None:
    for package in linked_packages(Path(sys.argv[1])):
        done = package / "__pycache__" / f"all-compiled.{sys.implementation.cache_tag}"  # by an earlier run, to the end
        if not done.exists():
            compileall.compile_dir(package, quiet=2, workers=0)  # some sources may not compile (say, examples for other Pythons)
            done.parent.mkdir(exist_ok=True)
            done.touch()


if __name__ == "__main__":
    main()
