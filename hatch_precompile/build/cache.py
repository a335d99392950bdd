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
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime._integrity import file_sha256
from ..runtime._layout import KERNELS_DIR, kernel_file
from ..runtime._schema import ArtifactEntry, BuiltWith

ENTRY_FILE = "entry.json"


def entry_files(entry: ArtifactEntry) -> list[str]:
    """The files an artifact's entry ships, relative to its model's folder."""
    lean = [entry["lean"]["file"]] if "lean" in entry and "file" in entry["lean"] else []
    return [entry["file"], *lean, *(f"{KERNELS_DIR}/{kernel_file(key)}" for key in entry["kernels"])]


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
            record = json.loads((folder / ENTRY_FILE).read_text(encoding="utf-8"))
            files = record["sha256"]
            if any(file_sha256(folder / name) != digest for name, digest in files.items()):
                raise ValueError("a file does not match its recorded sha256")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            if self.prune:
                shutil.rmtree(folder, ignore_errors=True)  # damaged: the caller compiles and stores it again
            return None
        for name in files:
            (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, model_dir / name)
        return record["entry"]

    def store(self, key: str, model_dir: Path, entry: ArtifactEntry) -> None:
        """Keep the artifact described by `entry` (its files read from `model_dir`)
        under `key`; atomic, and a no-op where an entry is already there."""
        folder = self._folder(key)
        if folder.is_dir():
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=folder.parent))
        try:
            digests = {}
            for name in entry_files(entry):
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(model_dir / name, scratch / name)
                digests[name] = file_sha256(scratch / name)
            (scratch / ENTRY_FILE).write_text(json.dumps({"entry": entry, "sha256": digests}, indent=1), encoding="utf-8")
            os.rename(scratch, folder)
        except OSError:
            if not folder.is_dir():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class PartMismatch(ValueError):
    """A part holds the artifact this build needs, compiled from something else."""


@dataclass(frozen=True)
class Claim:
    """A part's artifact for one model: the key it was compiled under, where it lies."""

    key: str
    part: Path
    built_with: dict[str, str]


@dataclass(frozen=True)
class ArtifactSources:
    """Where a worker looks before compiling, and where it keeps what it made.

    `claims` (artifact file -> Claim) are the parts given to the build for this
    model: such an artifact must come from its part, since the part's machine may
    be the only one that can compile it. Then the build cache, if any."""

    claims: dict[str, Claim]
    cache: EntryStore | None
    keep: EntryStore | None  # the build cache, or the part being written

    def fetch(self, key: str, file: str, model_dir: Path, built_with: BuiltWith) -> tuple[ArtifactEntry | None, str]:
        """(entry, origin) with the files copied into `model_dir`, or (None, "")."""
        claim = self.claims.get(file)
        if claim is not None:
            if claim.key != key:
                raise PartMismatch(_mismatch(claim, file, built_with))
            entry = EntryStore(claim.part, prune=False).fetch(key, model_dir)
            if entry is None:
                raise PartMismatch(f"part {claim.part}: the entry for {file} is missing or damaged (a file's sha256 differs); copy the part again or rebuild it")
            return entry, f"part {claim.part}"
        entry = self.cache.fetch(key, model_dir) if self.cache else None
        return (entry, "cached") if entry is not None else (None, "")

    def to_json(self) -> dict[str, Any]:
        return {
            "claims": {f: {"key": c.key, "part": str(c.part), "built_with": c.built_with} for f, c in self.claims.items()},
            "cache": str(self.cache.root) if self.cache else None,
            "keep": str(self.keep.root) if self.keep else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactSources:
        claims = {f: Claim(c["key"], Path(c["part"]), c["built_with"]) for f, c in data["claims"].items()}
        return cls(
            claims,
            EntryStore(Path(data["cache"])) if data["cache"] else None,
            EntryStore(Path(data["keep"])) if data["keep"] else None,
        )


def _mismatch(claim: Claim, file: str, built_with: BuiltWith) -> str:
    differences = [f"{what} {claim.built_with.get(what)!r} there, {value!r} here" for what, value in built_with.items() if claim.built_with.get(what) != value]
    why = (
        "it was compiled in another environment: " + "; ".join(differences)
        if differences
        else "the model this build captured differs from the one the part compiled (its code, its example inputs' "
        "shapes or dtypes, or the plugin changed since)"
    )
    return f"part {claim.part} holds {file}, but {why}; rebuild the part from this project and environment, or leave it out to compile {file} here"


@functools.cache
def plugin_fingerprint() -> str:
    """A hash of this plugin's code: any change to how artifacts are made or
    loaded makes new keys, even without a version bump."""
    digest = hashlib.sha256()
    package = Path(__file__).parent.parent  # hatch_precompile/
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()

