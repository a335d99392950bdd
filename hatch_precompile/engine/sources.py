"""Where a compile worker looks for an artifact before compiling it, and where it keeps it.

In order: the parts given to the build (`parts.py`), which must hold the
artifacts they claim; the local build cache (`cache.EntryStore`); the remote
store (`remote.py`), whose entries are copied into the local cache. What is
compiled goes into the local cache (or the part being written) and the remote
store. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime._schema import ArtifactEntry, BuiltWith
from .cache import EntryStore
from .remote import RemoteSettings, remote_cache


class PartMismatch(ValueError):
    """A part holds the artifact this build needs, compiled from something else."""


@dataclass(frozen=True)
class Claim:
    """A part's artifact for one model: the key it was compiled under, where it lies."""

    key: str
    part: Path
    built_with: BuiltWith


@dataclass(frozen=True)
class ArtifactSources:
    """Where a worker looks before compiling, and where it keeps what it made.

    `claims` (artifact file -> Claim) are the parts given to the build for this
    model: such an artifact must come from its part, since the part's machine may
    be the only one that can compile it. Then the build cache, then the remote
    store, if any."""

    claims: dict[str, Claim]
    cache: EntryStore | None
    keep: EntryStore | None  # the build cache, or the part being written
    remote: RemoteSettings | None = None  # the shared store behind the build cache, if any

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
        if entry is not None:
            return entry, "cached"
        if self.remote is not None:
            entry = remote_cache(self.remote).fetch(key, model_dir, self.cache)
            if entry is not None:
                return entry, f"remote {self.remote.address}"
        return None, ""

    def store(self, key: str, model_dir: Path, entry: ArtifactEntry, origin: str) -> None:
        """Keep an artifact this build used in the build cache (or the part being
        written); one it compiled, in the remote store too."""
        if self.keep is not None:
            self.keep.store(key, model_dir, entry)
        if self.remote is not None and origin == "compiled":
            remote_cache(self.remote).store(key, model_dir, entry)

    def to_json(self) -> dict[str, Any]:
        return {
            "claims": {f: {"key": c.key, "part": str(c.part), "built_with": c.built_with} for f, c in self.claims.items()},
            "cache": str(self.cache.root) if self.cache else None,
            "keep": str(self.keep.root) if self.keep else None,
            "remote": self.remote.to_json() if self.remote else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactSources:
        claims = {f: Claim(c["key"], Path(c["part"]), c["built_with"]) for f, c in data["claims"].items()}
        return cls(
            claims,
            EntryStore(Path(data["cache"])) if data["cache"] else None,
            EntryStore(Path(data["keep"])) if data["keep"] else None,
            RemoteSettings.from_json(data["remote"]) if data["remote"] else None,
        )


def _mismatch(claim: Claim, file: str, built_with: BuiltWith) -> str:
    differences = [f"{what} {claim.built_with.get(what)!r} there, {value!r} here" for what, value in built_with.items() if claim.built_with.get(what) != value]
    why = (
        "it was compiled in another environment: " + "; ".join(differences)
        if differences
        else "the model this build captured differs from the one the part compiled (its code, its example inputs' shapes or dtypes, or the plugin changed since)"
    )
    return f"part {claim.part} holds {file}, but {why}; rebuild the part from this project and environment, or leave it out to compile {file} here"
