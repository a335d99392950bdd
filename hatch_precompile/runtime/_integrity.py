"""Checking shipped files against the manifest before they are used.

Each file the manifest lists has a size and a sha256 (the manifest itself is
checked against the digest in `_build.py`). When each is checked:

- Code (the lean module, the artifact, the kernels) on every load: it is small,
  and it runs.
- Weights, which can be gigabytes, once per state of the file: they are hashed
  in chunks on all cores, against the manifest's per-chunk digests, and then a
  stamp is left in the private cache (`verified/`), named by the file's path,
  expected sha256, device, inode, size, modification and change times. A load
  that finds the stamp skips the hash. Any write to the file, a copy over it or
  a replacement changes one of those (the change time cannot be set back), so a
  changed file is hashed again before its numbers are used. What a stamp does
  not catch: bits that rot on the disk underneath the file system, and a user
  who can write the private cache. `hatch-precompile verify` hashes everything.
  Where the cache cannot be written, weights are hashed on every load.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._cache import private_cache_dir
from ._errors import PrecompiledIntegrityError, PrecompiledModelError
from ._manifest import HERE

CHUNK_SIZE = 32 << 20  # weights are hashed in chunks of this many bytes, one thread per core
_READ_SIZE = 4 << 20


def verified_bytes(record: dict[str, Any]) -> bytes:
    """A shipped file's bytes, checked against the manifest's size and sha256.
    The same bytes are then used, so nothing can change in between."""
    path = HERE / record["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _missing(path) from None
    _check(path, digest_mismatch(len(data), hashlib.sha256(data).hexdigest(), record))
    return data


def verified_path(record: dict[str, Any]) -> Path:
    """A shipped file's path, after hashing it (for files loaded by path: the
    dynamic loader opens kernels itself)."""
    path = HERE / record["file"]
    try:
        with path.open("rb") as stream:
            sha256 = hashlib.file_digest(stream, "sha256").hexdigest()
    except FileNotFoundError:
        raise _missing(path) from None
    _check(path, digest_mismatch(path.stat().st_size, sha256, record))
    return path


def verified_kernels(model: dict[str, Any], artifact: dict[str, Any]) -> dict[str, Path]:
    """The artifact's kernels by key, each file checked against the manifest."""
    return {key: verified_path(model["kernels"][key]) for key in artifact["kernels"]}


def verified_weights(record: dict[str, Any]) -> Path:
    """The weights file's path, hashed unless a stamp says this state of the file
    was hashed and matched before (see the module's docstring)."""
    path = HERE / record["file"]
    try:
        before = path.stat()
    except FileNotFoundError:
        raise _missing(path) from None
    stamp = _stamp(path, before, record["sha256"])
    if stamp is not None and stamp.exists():
        return path
    if before.st_size != record["size"]:
        _check(path, f"size {before.st_size}, expected {record['size']}")
    expected = record["chunk_sha256"]
    bad = [i for i, (found, want) in enumerate(zip(chunk_digests(path, record["chunk_size"]), expected)) if found != want]
    if bad:
        _check(path, f"sha256 differs in {len(bad)} of its {len(expected)} chunks, the first at byte {bad[0] * record['chunk_size']}")
    if stamp is not None and _state(path.stat()) == _state(before):  # unchanged while it was hashed
        _leave(stamp)
    return path


def chunk_digests(path: Path, chunk_size: int) -> list[str]:
    """The sha256 of each `chunk_size` bytes of the file, computed on all cores
    (hashlib and reads release the GIL). An empty file has one empty chunk."""
    size = path.stat().st_size
    with path.open("rb") as stream:

        def digest(start: int) -> str:
            sha256, buffer = hashlib.sha256(), bytearray(_READ_SIZE)
            view = memoryview(buffer)
            for offset in range(start, min(start + chunk_size, size), _READ_SIZE):
                read = os.preadv(stream.fileno(), [view[: min(_READ_SIZE, start + chunk_size - offset)]], offset)
                sha256.update(view[:read])
            return sha256.hexdigest()

        starts = range(0, size or 1, chunk_size)
        with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
            return list(pool.map(digest, starts))


def digest_mismatch(size: int, sha256: str, record: dict[str, Any]) -> str:
    """How a file's size and sha256 differ from its manifest record; "" if they match."""
    if size == record["size"] and sha256 == record["sha256"]:
        return ""
    return f"size {size}, expected {record['size']}; sha256 {'matches' if sha256 == record['sha256'] else 'differs'}"


def _check(path: Path, mismatch: str) -> None:
    if mismatch:
        raise PrecompiledIntegrityError(
            f"{path} does not match the manifest ({mismatch}): it was modified or truncated; reinstall the package"
        )


def _missing(path: Path) -> PrecompiledIntegrityError:
    return PrecompiledIntegrityError(f"{path} is missing: reinstall the package")


def _state(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _stamp(path: Path, info: os.stat_result, sha256: str) -> Path | None:
    """Where the stamp for this state of the file would be; None without a
    private cache that can be used (then every load hashes)."""
    try:
        folder = private_cache_dir() / "verified"
    except (OSError, PrecompiledModelError):
        return None
    identity = "\0".join(map(str, (path.resolve(), sha256, *_state(info))))
    return folder / hashlib.sha256(identity.encode()).hexdigest()


def _leave(stamp: Path) -> None:
    """Create the (empty) stamp: it exists or it does not, so concurrent loads
    cannot leave half of one. A cache that cannot be written is no error."""
    try:
        stamp.parent.mkdir(mode=0o700, exist_ok=True)
        stamp.touch()
    except OSError:
        pass
