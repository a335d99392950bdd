"""Choosing what to load here: the CPU target, then each shape variant's form.

Everything here decides from the manifest and this process alone: nothing is
unpickled and no native code is loaded for a variant that does not fit.

A form is one module (`_cpp.py`, `_lean.py`, `_artifact.py`) with the interface
`_graph.Form`: what the build shipped of it, what it needs of the process, which
kind of array it serves, and its `load`. `FORMS` lists them, preferred first; a
variant loads in the first form the build shipped that fits this process and
the caller's arrays (`HATCH_PRECOMPILE_FORM` may name one). A new form is a new
module and a line here. Nothing here imports torch: the NumPy path plans too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import _artifact, _cpp, _lean
from ._graph import Form
from ._manifest import CPU_TARGET_VARIABLE, HERE, MANIFEST, aten_level, model_from_source_config, native_problems, process_torch_and_python, read_manifest, release, running_environment
from ._schema import ArtifactEntry, Manifest, ModelEntry, SourceModel, TorchAndPython, is_torch_free

FORMS: dict[str, Form] = {_cpp.NAME: _cpp, _lean.NAME: _lean, _artifact.NAME: _artifact}  # preferred first
FORM_VARIABLE = "HATCH_PRECOMPILE_FORM"  # "auto" (default: the first that fits) or one form's name


@dataclass(frozen=True)
class Choice:
    """One shipped shape variant and the form it loads in (a name in `FORMS`)."""

    artifact: ArtifactEntry
    form: str
    arrays: str = "torch"  # the kind of array the caller holds: "torch" or "numpy"

    @property
    def file(self) -> str:
        return FORMS[self.form].file(self.artifact)

    @property
    def title(self) -> str:
        return FORMS[self.form].TITLE


@dataclass(frozen=True)
class Plan:
    """What loading a model would do: the variants to load (one CPU target, every
    shape variant), or none and the reason."""

    model: SourceModel  # what a fallback needs: the manifest entry, or pyproject.toml's table in a source checkout
    entry: ModelEntry | None  # the manifest entry; None without a manifest
    choices: list[Choice]
    reason: str


def plan(name: str, manifest: Manifest | None = None, arrays: str = "torch") -> Plan:
    """What loading `name` would do for a caller holding `arrays`."""
    manifest = manifest or read_manifest()
    if manifest is None:
        reason = f"no compiled artifacts next to {HERE} (a source checkout, an editable install, or a wheel built without the precompile hook)"
        return Plan(model_from_source_config(name), None, [], reason)
    model = manifest["models"].get(name)
    if model is None:
        known = ", ".join(sorted(manifest["models"])) or "none"
        raise KeyError(f"no model named {name!r} in {MANIFEST} (models: {known})")
    choices, reason = _choose(model, arrays)
    if not choices and not process_torch_and_python()["torch"]:
        built = release(model["artifacts"][0]["built_with"]["torch"])
        reason = f"torch is not installed: this package's compiled models run on torch {built}'s libraries (pip install torch=={built}){_torch_free_hint(model, arrays)}"
    return Plan(model, model, choices, reason)


def _torch_free_hint(model: ModelEntry, arrays: str) -> str:
    """Where a model has a torch-free form but the caller holds tensors, the way to it."""
    if arrays == "numpy" or not any(is_torch_free(artifact) for artifact in model["artifacts"]):
        return ""
    return '; its torch-free form runs without torch on NumPy arrays (arrays="numpy")'


def requested_form() -> str:
    form = os.environ.get(FORM_VARIABLE) or "auto"
    if form != "auto" and form not in FORMS:
        raise ValueError(f"{FORM_VARIABLE} must be one of auto, {', '.join(FORMS)}, got {form!r}")
    return form


def _choose(model: ModelEntry, arrays: str) -> tuple[list[Choice], str]:
    """The variants (every shape) of the best CPU target this process can run, each
    in the form to load, or none and why none fits.

    The torch build is compared by version and git revision: the artifact's exact
    key, torch_key(), hashes every torch source file and costs a second to compute."""
    here = running_environment()
    targets: dict[str, list[ArtifactEntry]] = {}
    for artifact in sorted(model["artifacts"], key=lambda a: aten_level(a["aten_capability"]), reverse=True):
        targets.setdefault(artifact["cpu_target"], []).append(artifact)
    forced = os.environ.get(CPU_TARGET_VARIABLE)
    if forced:
        if forced not in targets:
            return [], f"{CPU_TARGET_VARIABLE}={forced} but the shipped CPU targets are: {', '.join(targets)}"
        targets = {forced: targets[forced]}
    reasons = []
    for target, artifacts in targets.items():
        first = artifacts[0]  # the variants of one target share their requirements
        built = first["built_with"]
        problems = ["platform differs"] if built["platform"] != here["platform"] else []
        missing = sorted(set(first["cpu_features"]) - here["cpu_features"])
        if missing:
            problems.append(f"CPU lacks {', '.join(missing)}")
        if aten_level(first["aten_capability"]) > aten_level(here["aten_capability"]):
            problems.append(f"torch runs {here['aten_capability']} kernels here, not {first['aten_capability']} (see ATEN_CPU_CAPABILITY)")
        problems += native_problems(first["native"])
        if not problems:
            forms = [form_problems(artifact, here) for artifact in artifacts]
            chosen = [form_for(model, artifact, found, arrays) for artifact, found in zip(artifacts, forms)]
            choices = [Choice(artifact, how, arrays) for artifact, how in zip(artifacts, chosen) if how is not None]
            if len(choices) == len(artifacts):
                return choices, ""
            unfit = chosen.index(None)
            problems.append(_none_fits(model, artifacts[unfit], forms[unfit], arrays))
        reasons.append(
            f"{first['file']} was built with torch {built['torch']} ({built['torch_git'][:12]}) on cp{built['python'].replace('.', '')} {built['platform']} for {target}: " + ", ".join(problems)
        )
    found = ", ".join(sorted(here["cpu_features"])) or "none"
    torch = f"torch {here['torch']} ({here['torch_git'][:12]})" if here["torch"] else "no torch"
    running = f"running {torch} on cp{here['python'].replace('.', '')} {here['platform']} with {here['aten_capability']} kernels and CPU features: {found}"
    return [], f"no shipped artifact fits this process: {'; '.join(reasons)}; {running}"


def form_problems(artifact: ArtifactEntry, here: TorchAndPython) -> dict[str, list[str]]:
    """Why each form of a variant cannot run here, given the torch and Python it
    was built with (each form's own rules) and the form asked for; an empty
    list where it can."""
    requested = requested_form()
    return {name: ([f"{FORM_VARIABLE}={requested}"] if requested not in ("auto", name) else []) + form.problems(artifact, here) for name, form in FORMS.items()}


def form_for(model: ModelEntry, artifact: ArtifactEntry, forms: dict[str, list[str]], arrays: str, after: str | None = None) -> str | None:
    """The first form the build shipped for this variant that fits here and
    serves `arrays` (after the form `after`, in `FORMS`' order, where given), if any."""
    names = list(FORMS)
    candidates = names[names.index(after) + 1 :] if after is not None else names
    return next((name for name in candidates if FORMS[name].shipped(artifact) and not forms[name] and not FORMS[name].serves(model, artifact, arrays)), None)


def next_form(model: ModelEntry, choice: Choice) -> Choice | None:
    """The form a variant loads in when its chosen form failed to load here: the
    first after it (in `FORMS`' order) that the build shipped and that fits."""
    form = form_for(model, choice.artifact, form_problems(choice.artifact, process_torch_and_python()), choice.arrays, after=choice.form)
    return None if form is None else Choice(choice.artifact, form, choice.arrays)


def _none_fits(model: ModelEntry, artifact: ArtifactEntry, forms: dict[str, list[str]], arrays: str) -> str:
    """Why no form of this variant fits, form by form (those the model was built
    with, and for NumPy arrays the C++ form, which alone serves them)."""
    said = []
    for name, form in FORMS.items():
        refused, serves = form.refused(artifact), form.serves(model, artifact, arrays)
        if form.shipped(artifact):
            said.append(f"the {form.TITLE}: {', '.join(forms[name]) or serves}")
        elif refused or serves:
            why = serves or f"the build refused it for {artifact['file']}: {refused}"
            said.append(f"the {form.TITLE}: {why}")
    return "; ".join(said)


def why_form(choice: Choice) -> str:
    """Why a variant loads in this form rather than one preferred before it, as
    `explain()` and `hatch-precompile inspect` say it ("" where none was, such as
    the lean form of a model built without `cpp-form`)."""
    requested = requested_form()
    problems = form_problems(choice.artifact, process_torch_and_python())
    reasons = []
    for name, form in FORMS.items():
        if name == choice.form:
            break
        refused = form.refused(choice.artifact)
        if refused:
            reasons.append(f"the build refused the {form.TITLE}: {refused}")
        elif form.shipped(choice.artifact):
            reasons.append(f"{FORM_VARIABLE}={requested}" if requested != "auto" else f"the {form.TITLE} does not fit here: {', '.join(problems[name])}")
    return "".join(f"; {reason}" for reason in dict.fromkeys(reasons))
