"""Parts: artifacts compiled on one machine, assembled into a wheel on another.

`hatch-precompile compile-part --out DIR` (`engine.pipeline.compile_part`) compiles chosen
models and CPU targets of a project into DIR: an entry per artifact, as in the build cache
(`cache.EntryStore`), and `part.json`, which says what the part holds and what it
was compiled from:

    {"format": 1, "plugin": <plugin_fingerprint()>,
     "models": {name: {"config": ModelConfig.to_json(),
                       "artifacts": {file: {"key": ..., "built_with": {...}}}}}}

A wheel build given parts ($HATCH_PRECOMPILE_PARTS, folders separated by ":")
checks each against the project's configuration here, before any worker starts;
each worker then takes the parts' artifacts whose key matches what it captured,
refuses those whose key does not, and compiles the rest. No torch here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypedDict

from ..runtime._schema import BuiltWith
from .cache import plugin_fingerprint
from .config import TABLE, ConfigError, PrecompileConfig
from .model_config import ModelConfig, model_settings
from .protocol import BuiltModel
from .settings import PARTS_VARIABLE
from .sources import Claim

PART_FILE = "part.json"
PART_FORMAT = 1


def read_parts(folders: tuple[Path, ...], config: PrecompileConfig) -> dict[str, dict[str, Claim]]:
    """The parts' artifacts per model (file -> Claim), once every part is checked
    against the configuration and this plugin; raises ConfigError listing every
    problem at once."""
    problems: list[str] = []
    claims: dict[str, dict[str, Claim]] = {}
    for folder in folders:
        try:
            part: PartFile = json.loads((folder / PART_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            problems.append(f"{PARTS_VARIABLE}: {folder} is not a part ({PART_FILE}: {error}); make one with `hatch-precompile compile-part`")
            continue
        if not isinstance(part, dict) or part.get("format") != PART_FORMAT or part.get("plugin") != plugin_fingerprint():  # else, its shape is this plugin's
            problems.append(f"part {folder} was made by another hatch-precompile than this build's; make parts with the same hatch-precompile as the wheel build (pin it in [build-system] requires)")
            continue
        for name, held in part["models"].items():
            model = config.models.get(name)
            if model is None:
                problems.append(f"part {folder} holds model {name!r}, which {TABLE}.models does not declare")
                continue
            # The settings that decide what is compiled (ModelConfig's `compiled` ones); the
            # others (fallback, outputs, weights, cpu_targets) may change after a part is made.
            settings = model_settings(type(model))
            changed = [settings[k].key for k, v in model.compiled_json().items() if held["config"].get(k) != v]
            if changed:
                problems.append(f"part {folder}: model {name!r} was compiled from another configuration ({', '.join(f'{TABLE}.models.{name}.{key}' for key in changed)} differ); rebuild the part")
                continue
            for file, artifact in held["artifacts"].items():
                claim = Claim(artifact["key"], folder, artifact["built_with"])
                other = claims.setdefault(name, {}).setdefault(file, claim)
                if other.key != claim.key:
                    problems.append(f"parts {other.part} and {folder} both hold {name}/{file}, compiled from different graphs or environments")
    if problems:
        raise ConfigError(problems)
    return claims


def choose(config: PrecompileConfig, models: list[str] | None, cpu_targets: list[str] | None) -> list[ModelConfig]:
    """The models a part compiles (all by default), each narrowed to the chosen CPU
    targets (its own by default); ConfigError names unknown models and targets."""
    problems = [f"--models: {name!r} is not declared in {TABLE}.models ({', '.join(config.models)})" for name in models or [] if name not in config.models]
    chosen = [config.models[name] for name in models or config.models if name in config.models]
    if cpu_targets:
        narrowed = []
        for model in chosen:
            targets = tuple(t for t in model.cpu_targets if t in cpu_targets)
            if targets:
                narrowed.append(dataclasses.replace(model, cpu_targets=targets))
        unused = sorted(set(cpu_targets) - {t for m in chosen for t in m.cpu_targets})
        if unused:
            problems.append(f"--cpu-targets: no chosen model compiles for {', '.join(unused)}")
        chosen = narrowed
    if problems:
        raise ConfigError(problems)
    return chosen


class PartArtifact(TypedDict):
    key: str
    built_with: BuiltWith


class PartModel(TypedDict):
    config: dict[str, Any]  # ModelConfig.to_json()
    artifacts: dict[str, PartArtifact]  # by file


class PartFile(TypedDict):
    """A part's PART_FILE (the module docstring shows it)."""

    format: int
    plugin: str
    models: dict[str, PartModel]


def write_part_file(out: Path, config: PrecompileConfig, compiled: dict[str, BuiltModel]) -> None:
    part: PartFile = {"format": PART_FORMAT, "plugin": plugin_fingerprint(), "models": {}}
    for name, model in compiled.items():
        part["models"][name] = {
            "config": config.models[name].to_json(),
            "artifacts": {a["file"]: {"key": model.keys[a["file"]], "built_with": a["built_with"]} for a in model.entry["artifacts"]},
        }
    (out / PART_FILE).write_text(json.dumps(part, indent=1), encoding="utf-8")
