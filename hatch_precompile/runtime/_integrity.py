"""Checking shipped files against the manifest before they are used.

Each file the manifest lists has a size and a sha256 (the manifest itself is
checked against the digest in `_build.py`). When each is checked:

- Code (the lean module, the artifact, the kernels) on every load: it is small,
  and it runs.
- Weights, which can be gigabytes, once per state of the file, and with a
  cheaper checksum (`chunk_checksums`): the file is memory-mapped, and each
  32 MiB chunk is checked by the CRC-32 of its 4 KiB rows' sums (64-bit sums of
  each row's 64-bit words, which torch adds at memory speed on every core:
  several times faster than a CRC-32 of the bytes, the fastest checksum the
  standard library has). This catches any changed word, flipped bit, zeroed or
  foreign block, blocks out of order, a truncation or another file of the same
  size, except with odds of about 1 in 4 billion; what it misses is words
  reordered inside one 4 KiB row, or several changes in one row whose sum
  cancels, which is not how disks, file systems or copies fail. It is no defence
  against someone who wants to change the weights, but neither would a sha256
  be: whoever can write this folder can write this code. Then a stamp is left in
  the private cache (`verified/`), named by the file's path, expected sha256,
  device, inode, size, modification and change times; a load that finds it
  skips the check. Any write to the file, a copy over it or a replacement
  changes one of those (the change time cannot be set back), so a changed file
  is checked again before its numbers are used. A stamp does not catch bits that
  rot on the disk underneath the file system. Where the cache cannot be written,
  weights are checked on every load. `hatch-precompile verify` checks every
  sha256.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._arrays import ArrayKind
from ._cache import private_cache_dir
from ._errors import PrecompiledIntegrityError, PrecompiledModelError
from ._manifest import HERE
from ._schema import ArtifactEntry, ModelEntry, WeightsEntry

CHUNK_SIZE = 32 << 20  # weights are checked in chunks of this many bytes (a multiple of ROW_SIZE)
ROW_SIZE = 4096  # bytes whose 64-bit words are summed together: a page, and a file-system block


def verified_bytes(record: Mapping[str, Any]) -> bytes:
    """A shipped file's bytes, checked against the manifest's size and sha256.
    The same bytes are then used, so nothing can change in between."""
    path: Path = HERE / record["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _missing(path) from None
    _check(path, digest_mismatch(len(data), hashlib.sha256(data).hexdigest(), record))
    return data


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in blocks."""
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def verified_path(record: Mapping[str, Any]) -> Path:
    """A shipped file's path, after hashing it (for files loaded by path: the
    dynamic loader opens kernels itself)."""
    path: Path = HERE / record["file"]
    try:
        sha256 = file_sha256(path)
    except FileNotFoundError:
        raise _missing(path) from None
    _check(path, digest_mismatch(path.stat().st_size, sha256, record))
    return path


def verified_kernels(model: ModelEntry, artifact: ArtifactEntry) -> dict[str, Path]:
    """The artifact's kernels by key, each file checked against the manifest."""
    return {key: verified_path(model["kernels"][key]) for key in artifact["kernels"]}


def verified_weights(record: WeightsEntry, kind: ArrayKind) -> mmap.mmap:
    """The weights file, memory-mapped (copy-on-write), after checking its size and
    each chunk's checksum against the manifest, unless a stamp says this state of the
    file was checked before (see the module's docstring). The check reads through
    the same mapping the tensors will use, so its page faults are ones the first
    call would take anyway."""
    path = HERE / record["file"]
    try:
        with path.open("rb") as stream:
            state = os.fstat(stream.fileno())
            _check(path, "" if state.st_size == record["size"] else f"size {state.st_size}, expected {record['size']}")
            mapping = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise _missing(path) from None
    stamp = _stamp(path, state, record["sha256"])
    if stamp is not None and stamp.exists():
        return mapping
    expected = record["chunk_checksums"]
    found = chunk_checksums(mapping, record["chunk_size"], kind.row_sums)
    bad = [i for i, (got, want) in enumerate(zip(found, expected)) if got != want]
    if bad:
        _check(path, f"checksum differs in {len(bad)} of its {len(expected)} chunks, the first at byte {bad[0] * record['chunk_size']}")
    if stamp is not None and _state(path.stat()) == _state(state):  # unchanged while it was checked
        _leave(stamp)
    return mapping


def chunk_checksums(data: Any, chunk_size: int, row_sums: Callable[[Any, int], bytes | bytearray]) -> list[int]:
    """Each `chunk_size` bytes' checksum: the CRC-32 of its rows' sums, then of
    the bytes after the buffer's last whole row. `row_sums(data, rows)` gives the
    sums of the first `rows` rows (ROW_SIZE bytes each, as little-endian 64-bit
    words, modulo 2**64) as little-endian 64-bit words: torch's at load time
    (`torch_row_sums`), numpy's at build time, where torch is not imported.
    Integer sums are exact, so both give the same checksums. An empty buffer has
    one empty chunk."""
    with memoryview(data) as view:
        rows = len(view) // ROW_SIZE
        sums = row_sums(data, rows) if rows else b""
        per_chunk = chunk_size // ROW_SIZE * 8  # bytes of `sums`
        checksums = []
        for index, start in enumerate(range(0, len(view) or 1, chunk_size)):
            crc = zlib.crc32(sums[index * per_chunk : (index + 1) * per_chunk])
            with view[max(start, rows * ROW_SIZE) : start + chunk_size] as tail:
                checksums.append(zlib.crc32(tail, crc))
        return checksums


def torch_row_sums(data: Any, rows: int) -> bytearray:
    """`chunk_checksums`' row sums by torch, on every core, reading through
    `data` itself: for the weights, the mapping their tensors then view, so the
    check's page faults are ones the first call would take anyway."""
    import torch

    sums = bytearray(8 * rows)
    words = torch.frombuffer(data, dtype=torch.int64, count=rows * ROW_SIZE // 8)
    torch.sum(words.view(rows, ROW_SIZE // 8), 1, out=torch.frombuffer(sums, dtype=torch.int64))
    return sums


def numpy_row_sums(data: Any, rows: int) -> bytes:
    """`chunk_checksums`' row sums by NumPy (one core), through `data` itself."""
    import numpy

    words = numpy.frombuffer(data, dtype="<i8", count=rows * ROW_SIZE // 8)
    sums: bytes = words.reshape(rows, ROW_SIZE // 8).sum(1, dtype="<i8").tobytes()  # wraps modulo 2**64, as torch's
    return sums


def digest_mismatch(size: int, sha256: str, record: Mapping[str, Any]) -> str:
    """How a file's size and sha256 differ from its manifest record; "" if they match."""
    if size == record["size"] and sha256 == record["sha256"]:
        return ""
    return f"size {size}, expected {record['size']}; sha256 {'matches' if sha256 == record['sha256'] else 'differs'}"


def _check(path: Path, mismatch: str) -> None:
    if mismatch:
        raise PrecompiledIntegrityError(f"{path} does not match the manifest ({mismatch}): it was modified or truncated; reinstall the package")


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
