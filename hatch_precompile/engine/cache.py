"""Compiled artifacts kept by what they were compiled from: the build cache and parts.

An entry is one artifact with everything the wheel ships for it: the artifact
file, its lean module if any, its kernels, and its manifest entry as the build
left it. It is stored under its key (`key.artifact_key`: the exported graph,
the inputs and dims, the inductor options, the CPU target, the torch build,
Python and this plugin's code), so an entry is only found by a compile that
would have produced the same bytes.

Entries are written to a temporary folder and renamed into place, so a reader
sees a whole entry or none; each file's sha256 is recorded and checked when the
entry is read, and a damaged entry is a miss (and is removed), never a file in
a wheel. Two layouts hold entries: the user's build cache
(`$HATCH_PRECOMPILE_BUILD_CACHE`, default ~/.cache/hatch-precompile/build) and
a part folder written by `hatch-precompile compile-part` (see `parts.py`).
No torch here: the hook reads the settings before any worker starts.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from ..runtime._integrity import file_sha256
from ..runtime._layout import KERNELS_DIR, kernel_file
from ..runtime._schema import ArtifactEntry

ENTRY_FILE = "entry.json"


def entry_files(entry: ArtifactEntry) -> list[str]:
    """The files an artifact's entry ships, relative to its model's folder."""
    lean = [entry["lean"]["file"]] if "lean" in entry and "file" in entry["lean"] else []
    cpp = [entry["cpp"]["file"]] if "file" in entry.get("cpp", {}) else []
    cpp += [entry["cpp"]["ops"]["file"]] if "ops" in entry.get("cpp", {}) else []
    return [entry["file"], *lean, *cpp, *(f"{KERNELS_DIR}/{kernel_file(key)}" for key in entry["kernels"])]


@dataclass(frozen=True)
class EntryStore:
    """A folder of entries, `<root>/<key[:2]>/<key>/`."""

    root: Path
    prune: bool = True  # remove a damaged entry (the build cache); a part is the user's, left as it is

    def _folder(self, key: str) -> Path:
        return self.root / key[:2] / key

    def fetch(self, key: str, model_dir: Path) -> ArtifactEntry | None:
        """Copy the entry's files into `model_dir` and return its manifest entry;
        None when there is no whole, undamaged entry under `key`."""
        folder = self._folder(key)
        try:
            record = _checked_record(folder, key)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            if self.prune:
                shutil.rmtree(folder, ignore_errors=True)  # damaged: the caller compiles and stores it again
            return None
        for name in record["sha256"]:
            (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, model_dir / name)
        return record["entry"]

    def store(self, key: str, model_dir: Path, entry: ArtifactEntry) -> None:
        """Keep the artifact described by `entry` (its files read from `model_dir`)
        under `key`; atomic, and a no-op where an entry is already there."""

        def fill(scratch: Path) -> None:
            names = entry_files(entry)
            for name in names:
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(model_dir / name, scratch / name)
            (scratch / ENTRY_FILE).write_bytes(self.record(key, entry, {name: scratch / name for name in names}))

        self._place(key, fill)

    def adopt(self, key: str, archive: bytes) -> str | None:
        """Keep an entry that arrived as a tar (`remote.pack_entry`) under `key`,
        once it is checked as `fetch` checks one; what is wrong with it, or None."""

        def fill(scratch: Path) -> None:
            with tarfile.open(fileobj=io.BytesIO(archive)) as members:
                members.extractall(scratch, filter="data")  # no absolute paths, no "..", no links out
            _checked_record(scratch, key)

        try:
            self._place(key, fill)
        except (OSError, ValueError, KeyError, TypeError, tarfile.TarError) as error:
            return f"{type(error).__name__}: {error}"
        return None

    @staticmethod
    def record(key: str, entry: ArtifactEntry, files: dict[str, Path]) -> bytes:
        """The entry's ENTRY_FILE: its key, its manifest entry, and each file's sha256."""
        record: EntryRecord = {"key": key, "entry": entry, "sha256": {name: file_sha256(path) for name, path in files.items()}}
        return json.dumps(record, indent=1).encode()

    def _place(self, key: str, fill: Callable[[Path], None]) -> None:
        """Run `fill` on a new scratch folder beside the entry's place and rename
        it into place: a reader sees a whole entry or none. A no-op where an entry
        is already there (another build put the same one there first)."""
        folder = self._folder(key)
        if folder.is_dir():
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=folder.parent))
        try:
            fill(scratch)
            os.rename(scratch, folder)
        except OSError:
            if not folder.is_dir():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class EntryRecord(TypedDict):
    """An entry's ENTRY_FILE."""

    key: str  # the artifact key it was stored under
    entry: ArtifactEntry
    sha256: dict[str, str]  # each file of `entry_files(entry)`, by its path in the entry's folder


def _checked_record(folder: Path, key: str) -> EntryRecord:
    """The folder's ENTRY_FILE, once it has the record's shape, lists exactly the
    files its entry ships, each matching its sha256, and was stored under `key`;
    ValueError or OSError where not."""
    record = json.loads((folder / ENTRY_FILE).read_text(encoding="utf-8"))
    if not (isinstance(record, dict) and isinstance(record.get("entry"), dict) and isinstance(record.get("sha256"), dict)):
        raise ValueError(f"{ENTRY_FILE} is not an entry record")
    if record.get("key") != key:
        raise ValueError(f"it was stored under another key ({str(record.get('key'))[:12]})")
    if sorted(record["sha256"]) != sorted(entry_files(record["entry"])):
        raise ValueError(f"{ENTRY_FILE} lists other files than its entry ships")
    if any(file_sha256(folder / name) != digest for name, digest in record["sha256"].items()):
        raise ValueError("a file does not match its recorded sha256")
    return cast(EntryRecord, record)


@functools.cache
def plugin_fingerprint() -> str:
    """A hash of this plugin's code: any change to how artifacts are made or
    loaded makes new keys, even without a version bump."""
    digest = hashlib.sha256()
    package = Path(__file__).parent.parent  # hatch_precompile/
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
