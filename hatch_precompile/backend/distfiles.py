"""Rewriting a built wheel or sdist: add files, set the tag, add requirements, regenerate RECORD.

Used by the setuptools backend, which lets setuptools build and then makes its
wheel what the hatch hook's would be. Written with zipfile and tarfile rather
than a library: setuptools writes wheels with the `wheel` project's `WheelFile`,
which it vendors privately and which the `wheel` project does not offer as a
stable API; hatchling's writer is internal too. What a wheel needs (PEP 427, the
binary distribution format spec) is small: every file, then RECORD with each
file's urlsafe-base64 sha256 (no padding) and size. The rewrite is reproducible:
entries in sorted order (the `.dist-info` folder last, RECORD at the very end),
one fixed timestamp (SOURCE_DATE_EPOCH, else 1980-01-01) and normalised
permissions, so two builds of the same source give byte-identical wheels.
"""

from __future__ import annotations

import base64
import csv
import functools
import gzip
import hashlib
import io
import os
import struct
import tarfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from packaging.requirements import Requirement
from packaging.tags import parse_tag
from packaging.utils import parse_wheel_filename

_ZIP_EPOCH = 315532800  # 1980-01-01 00:00:00 UTC, the earliest time a zip entry can hold
_RECORD_SIGNATURES = ("RECORD", "RECORD.jws", "RECORD.p7s")  # stale once the wheel is rewritten


def _requirement_key(text: str) -> str:
    return str(Requirement(text))


def with_requirements(metadata: bytes, requirements: list[str]) -> bytes:
    """Core metadata (METADATA, PKG-INFO) with a `Requires-Dist` line for each of
    `requirements` it lacks, after its last unconditional one (or before the
    extras and the body). The rest is kept byte for byte."""
    text = metadata.decode("utf-8")
    head, separator, body = text.partition("\n\n")
    if not separator:  # no description: the headers are the whole file
        head, separator, body = text.rstrip("\n"), "\n", ""
    lines = head.split("\n")
    present = {_requirement_key(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")}
    missing = [f"Requires-Dist: {r}" for r in requirements if _requirement_key(r) not in present]
    if not missing:
        return metadata
    unconditional = [i for i, line in enumerate(lines) if line.startswith("Requires-Dist:") and "extra" not in str(Requirement(line.split(":", 1)[1].strip()).marker)]
    if unconditional:
        at = unconditional[-1] + 1
    else:
        at = next((i for i, line in enumerate(lines) if line.startswith(("Requires-Dist:", "Provides-Extra:", "Dynamic:"))), len(lines))
    lines[at:at] = missing
    return ("\n".join(lines) + separator + body).encode("utf-8")


def _with_requires_txt(requires: bytes, requirements: list[str]) -> bytes:
    """setuptools' `.egg-info/requires.txt`: unconditional requirements first, then `[extra]` sections."""
    text = requires.decode("utf-8")
    plain = text.split("\n[", 1)[0] if not text.startswith("[") else ""
    present = {_requirement_key(line) for line in plain.splitlines() if line.strip()}
    missing = [r for r in requirements if _requirement_key(r) not in present]
    return "".join(f"{r}\n" for r in missing).encode("utf-8") + requires


# --- the wheel -------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    """One file of the wheel being written: where its bytes come from, and its mode."""

    size: int
    executable: bool
    open: Callable[[], IO[bytes]]


def _bytes_entry(data: bytes, executable: bool = False) -> _Entry:
    return _Entry(len(data), executable, lambda: io.BytesIO(data))


def _file_entry(path: Path) -> _Entry:
    status = path.stat()
    return _Entry(status.st_size, bool(status.st_mode & 0o100), lambda: path.open("rb"))


def rewrite_wheel(
    built: Path,
    wheel_directory: Path,
    requirements: list[str],
    *,
    replace: str | None = None,
    files: dict[str, str] | None = None,
    tag: str | None = None,
) -> str:
    """setuptools' wheel `built`, rewritten into `wheel_directory`: the entries
    under `replace` dropped and `files` ({staged file: path in wheel}) added,
    `requirements` added to METADATA, `tag` set (and Root-Is-Purelib: false), RECORD
    regenerated. Returns the new wheel's file name."""
    dist, version, build, _ = parse_wheel_filename(built.name)
    prefix = built.name.removesuffix(".whl").split("-")
    with zipfile.ZipFile(built) as source:
        names = [info.filename for info in source.infolist() if not info.is_dir()]
        (dist_info,) = {name.split("/", 1)[0] for name in names if name.split("/", 1)[0].endswith(".dist-info")}
        entries: dict[str, _Entry] = {}
        for info in source.infolist():
            name = info.filename
            if info.is_dir() or name in {f"{dist_info}/{record}" for record in _RECORD_SIGNATURES}:
                continue
            if replace is not None and name.startswith(replace):
                continue  # the staged files are the whole of `_precompiled/`, whatever setuptools collected there
            executable = bool((info.external_attr >> 16) & 0o100)
            entries[name] = _Entry(info.file_size, executable, functools.partial(source.open, name))
        entries[f"{dist_info}/METADATA"] = _bytes_entry(with_requirements(source.read(f"{dist_info}/METADATA"), requirements))
        if tag is not None:
            entries[f"{dist_info}/WHEEL"] = _bytes_entry(_with_tag(source.read(f"{dist_info}/WHEEL"), tag))
        for staged, path in (files or {}).items():
            entries[path] = _file_entry(Path(staged))

        name = "-".join([prefix[0], prefix[1], *prefix[2:-3], *(tag.split("-") if tag else prefix[-3:])]) + ".whl"
        assert parse_wheel_filename(name)[:3] == (dist, version, build), name
        wheel_directory.mkdir(parents=True, exist_ok=True)
        partial = wheel_directory / f".{name}.partial"
        try:
            _write_wheel(partial, entries, f"{dist_info}/RECORD")
            os.replace(partial, wheel_directory / name)
        finally:
            partial.unlink(missing_ok=True)
    return name


def _with_tag(wheel_file: bytes, tag: str) -> bytes:
    """The WHEEL file with `Root-Is-Purelib: false` and `tag`'s Tag lines in place of setuptools' ones."""
    lines = wheel_file.decode("utf-8").splitlines()
    tags = [f"Tag: {t}" for t in sorted(str(t) for t in parse_tag(tag))]
    first_tag = next((i for i, line in enumerate(lines) if line.startswith("Tag:")), len(lines))
    kept = [line for line in lines[:first_tag] if not line.startswith("Root-Is-Purelib:")]
    rest = [line for line in lines[first_tag:] if not line.startswith(("Tag:", "Root-Is-Purelib:"))]
    return "\n".join([*kept, "Root-Is-Purelib: false", *tags, *rest]).encode("utf-8") + b"\n"


def _zip_date_time() -> tuple[int, int, int, int, int, int]:
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    timestamp = max(int(epoch), _ZIP_EPOCH) if epoch.isdigit() else _ZIP_EPOCH
    return time.gmtime(timestamp)[:6]


def _write_wheel(path: Path, entries: dict[str, _Entry], record_name: str) -> None:
    """Write `entries` as a wheel at `path`, RECORD last, reproducibly."""
    dist_info = record_name.split("/", 1)[0] + "/"
    order = sorted(n for n in entries if not n.startswith(dist_info)) + sorted(n for n in entries if n.startswith(dist_info))
    date_time = _zip_date_time()

    def zip_info(name: str, executable: bool, size: int) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time)
        info.create_system = 3  # Unix, so that the mode below is read
        info.external_attr = (0o100755 if executable else 0o100644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        info.file_size = size  # lets zipfile choose ZIP64 up front for large files
        return info

    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")  # RECORD is CSV; names with commas or quotes get quoted
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name in order:
            entry = entries[name]
            digest, size = hashlib.sha256(), 0
            with entry.open() as source, wheel.open(zip_info(name, entry.executable, entry.size), "w") as target:
                for block in iter(lambda: source.read(1 << 20), b""):
                    digest.update(block)
                    target.write(block)
                    size += len(block)
            if size != entry.size:
                raise RuntimeError(f"hatch-precompile: {name} changed while the wheel was written ({entry.size} -> {size} bytes)")
            rows.writerow([name, record_hash(digest.digest()), size])
        rows.writerow([record_name, "", ""])
        data = record.getvalue().encode("utf-8")
        wheel.writestr(zip_info(record_name, False, len(data)), data)


def record_hash(sha256: bytes) -> str:
    """A file's hash as RECORD writes it: `sha256=` and urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(sha256).rstrip(b"=").decode("ascii")


# --- the sdist -------------------------------------------------------------------


def rewrite_sdist(built: Path, sdist_directory: Path, requirements: list[str], loader: str) -> None:
    """setuptools' sdist with `requirements` in PKG-INFO (the sdist's core metadata)
    and in the PKG-INFO and requires.txt of the `.egg-info` folder setuptools puts
    in it, and without the generated loader (the folder `loader`, relative to the
    project), which setuptools collects as a subpackage when an earlier build wrote
    it: as under hatch (where .gitignore keeps it out), the sdist never holds it,
    and the wheel build writes it afresh. Every other member, and every member's
    attributes, as they were."""
    raw = built.read_bytes()
    gzip_mtime = struct.unpack("<I", raw[4:8])[0]  # keep setuptools' gzip header time
    top = built.name.removesuffix(".tar.gz")
    sdist_directory.mkdir(parents=True, exist_ok=True)
    partial = sdist_directory / f".{built.name}.partial"
    try:
        with (
            tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as source,
            partial.open("wb") as out,
            gzip.GzipFile(filename=built.name, mode="wb", fileobj=out, mtime=gzip_mtime) as compressed,
            tarfile.open(fileobj=compressed, mode="w", format=source.format) as target,
        ):
            patched = 0
            for member in source.getmembers():
                if member.name == f"{top}/{loader}" or member.name.startswith(f"{top}/{loader}/"):
                    continue
                if not member.isfile():
                    target.addfile(member)
                    continue
                stream = source.extractfile(member)
                assert stream is not None
                if member.name == f"{top}/PKG-INFO" or member.name.endswith(".egg-info/PKG-INFO"):
                    data = with_requirements(stream.read(), requirements)
                    patched += member.name == f"{top}/PKG-INFO"
                elif member.name.endswith(".egg-info/requires.txt"):
                    data = _with_requires_txt(stream.read(), requirements)
                elif member.name.endswith(".egg-info/SOURCES.txt"):
                    lines = stream.read().decode("utf-8").splitlines(keepends=True)
                    data = "".join(line for line in lines if not line.startswith(f"{loader}/")).encode("utf-8")
                else:
                    target.addfile(member, stream)
                    continue
                member.size = len(data)
                target.addfile(member, io.BytesIO(data))
            if patched != 1:
                raise RuntimeError(f"hatch-precompile: setuptools' sdist {built.name} has no {top}/PKG-INFO to add the pins to")
        os.replace(partial, sdist_directory / built.name)
    finally:
        partial.unlink(missing_ok=True)
