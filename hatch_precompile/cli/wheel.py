"""Commands on a built wheel: inspect and verify. Wheels are read as zip files:
nothing is installed, and nothing from the wheel is imported or executed."""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import io
import json
import math
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from ..backend.distfiles import record_hash
from ..runtime._layout import BUILD_MODULE, MANIFEST_FILE, PRECOMPILED_DIR
from ..runtime._schema import ArtifactEntry, BuiltWith, Manifest, ModelEntry, WeightSpec, has_cpp_form, has_lean_form, is_lean_only, is_torch_free
from ..runtime._weights import ITEM_SIZES
from ._common import FAILED, OK, CommandError, field_lines, print_json, table


@dataclass
class Wheel:
    """A built wheel, read as a zip archive: nothing in it is imported or run."""

    path: Path
    archive: zipfile.ZipFile
    tags: list[str]  # "cp311-cp311-manylinux_2_28_x86_64", ...
    precompiled: str  # the folder in the wheel, e.g. "example_pkg/_precompiled/"
    dist_info: str  # e.g. "example_pkg-0.1.0.dist-info/"

    def read(self, name: str) -> bytes:
        """A file's bytes; `name` is its path in the wheel."""
        try:
            return self.archive.read(name)
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as error:  # a bad CRC or deflate stream: the archive is damaged
            raise CommandError(f"{self.path}: cannot read {name}: {error}") from error

    def raw_manifest(self) -> Manifest:
        """The manifest as stored, its format checked but not yet its digest."""
        from ..runtime import MANIFEST_FORMAT

        name = self.precompiled + MANIFEST_FILE
        try:
            manifest: Manifest = json.loads(self.read(name))
        except ValueError as error:
            raise CommandError(f"{self.path}: {name} is not valid JSON ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise CommandError(f"{self.path}: {name} has format {found!r}; this hatch-precompile reads format {MANIFEST_FORMAT}")
        return manifest

    def requires_dist(self) -> list[str]:
        name = self.dist_info + "METADATA"
        if name not in self.archive.namelist():
            return []
        return HeaderParser().parsestr(self.read(name).decode("utf-8", "replace")).get_all("Requires-Dist") or []


def open_wheel(path: Path) -> Wheel:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    if not path.is_file():
        raise CommandError(f"{path}: no such file")
    try:
        _, _, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as error:
        raise CommandError(f"{path}: not a wheel ({error})") from None
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise CommandError(f"{path}: not a wheel: not a readable zip archive ({error})") from None
    names = archive.namelist()
    manifests = [n for n in names if n.count("/") == 2 and n.endswith(f"/{PRECOMPILED_DIR}/{MANIFEST_FILE}")]
    if not manifests:
        raise CommandError(f"{path}: no <package>/{PRECOMPILED_DIR}/{MANIFEST_FILE} in this wheel: it was not built with the hatch-precompile hook (or was built with --no-hooks)")
    if len(manifests) > 1:
        raise CommandError(f"{path}: several precompiled packages in one wheel ({', '.join(manifests)}); expected one")
    dist_infos = sorted({n.split("/")[0] + "/" for n in names if n.split("/")[0].endswith(".dist-info")})
    return Wheel(
        path=path,
        archive=archive,
        tags=sorted(str(tag) for tag in tags),
        precompiled=manifests[0].removesuffix(MANIFEST_FILE),
        dist_info=dist_infos[0] if dist_infos else "",
    )


def _torch_requirement(wheel: Wheel) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement

    for text in wheel.requires_dist():
        try:
            if Requirement(text).name.lower() == "torch":
                return text
        except InvalidRequirement:
            continue
    return None


def _shape_text(model: ModelEntry, artifact: ArtifactEntry) -> str:
    """The shape variant: the dims it is specialised to, or "dynamic" and the ranges."""
    specialized = artifact["specialized"]
    dynamic = [f"{name} {dim['min']}-{dim['max']}" for name, dim in model["dims"].items() if dim["dynamic"] and name not in specialized]
    if specialized:
        return ", ".join([*(f"{name}={size}" for name, size in specialized.items()), *dynamic])
    return f"dynamic ({', '.join(dynamic)})" if dynamic else "static"


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _short_torch(built_with: BuiltWith) -> str:
    return f"{built_with['torch']} (git {built_with['torch_git'][:12]})"


# ---------------------------------------------------------------------------
# inspect


def inspect(args: argparse.Namespace) -> int:
    """List what WHEEL ships: per model and artifact, its CPU target, forms, shape and size.

    Also the torch the wheel requires and its platform tag. An artifact's size is
    its own, its kernels' and its C++ form's library; its load forms are "C++ +"
    where it has that form (else why the build refused it, where the model asked
    for it), then "lean + artifact", "artifact only" and why the build refused
    the lean form, or, for int8, "lean only".
    Then, per model, its precision (and quantized layers), whether it runs on
    NumPy arrays without torch (`arrays="numpy"`: its C++ form), or why not, and
    its state: the buffers each handle holds a copy of, with their bytes.

    Reads the wheel as a zip file; installs, imports and verifies nothing (see
    `verify`).

    exit status: 0 listed; 2 WHEEL is not a wheel built with the hook.
    """
    wheel = open_wheel(args.wheel)
    manifest = wheel.raw_manifest()
    summary, rows, models = _wheel_summary(wheel, manifest), _artifact_rows(manifest), _model_rows(manifest)
    if args.json:
        print_json({**summary, "artifacts": rows, "models": models})
        return OK
    print(wheel.path.name)
    fields = {
        "platform": f"{', '.join(summary['platform_tags'])} (tag {', '.join(summary['tags'])})",
        "requires": ", ".join(summary["requires_dist"]) if summary["requires_torch"] else "no torch requirement in METADATA",
        "compiled with": f"torch {', '.join(summary['compiled_with'])}, Python {', '.join(summary['python'])}",
        "package": f"{summary['package']}, built by {summary['built_by']}",
    }
    print(field_lines(fields))
    print()
    header = ["model", "artifact", "CPU target", "shape variant", "size", "load forms"]
    print(table(header, [[r["model"], r["artifact"], r["cpu_target"], r["shape"], _human(r["size"]), _forms_text(r)] for r in rows]))
    print()
    for name, model in models.items():
        print(f"{name}: {_precision_text(model)}")
        print(f"  without torch (arrays='numpy'): {model['without_torch']}")
        if model["state"]:
            buffers = ", ".join(f"{s['name']} ({'x'.join(map(str, s['shape']))} {s['dtype']})" for s in model["state"])
            print(f"  state: {buffers}; {_human(model['state_bytes_per_handle'])} per handle")
    return OK


def _model_rows(manifest: Manifest) -> dict[str, dict[str, Any]]:
    """Per model: its precision, its quantized layers (weight-only schemes) and its
    state (the buffers each handle holds a copy of)."""
    models = {}
    for name, model in sorted(manifest["models"].items()):
        specs = model["weights"]["specs"]
        state: list[dict[str, Any]] = [{"name": buffer, "shape": specs[buffer]["shape"], "dtype": specs[buffer]["dtype"], "bytes": _bytes(specs[buffer])} for buffer in model["state"]]
        quantization = model.get("quantization")
        models[name] = {
            "precision": model["quantize"] or model["dtype"] or "float32",
            "quantized_layers": quantization["layers"] if quantization else [],
            "left_in_bfloat16": quantization["left"] if quantization else {},
            "group_size": quantization.get("group_size") if quantization else None,
            "shared_input": quantization.get("shared_input", {}) if quantization else {},
            "state": state,
            "state_bytes_per_handle": sum(s["bytes"] for s in state),
            "without_torch": _without_torch(model),
        }
    return models


def _without_torch(model: ModelEntry) -> str:
    """Whether `load_compiled(..., arrays="numpy")` can run the model without
    torch's Python, from the manifest alone: "yes", or "no: " and why."""
    from ..runtime._cpp import numpy_refusal

    for artifact in model["artifacts"]:
        refusal = numpy_refusal(model, artifact)
        if refusal:
            return f"no: {artifact['file']}: {refusal}"
    leaves = [*model["inputs"]["leaves"], *model["outputs"]["leaves"]]
    free = " (torch-free: on the wheel's own shim, with torch absent)" if all(is_torch_free(artifact) for artifact in model["artifacts"]) else ""
    return "yes" + free + (" (its bfloat16 arrays need ml_dtypes)" if any(leaf.get("dtype") == "bfloat16" for leaf in leaves) else "")


def _bytes(spec: WeightSpec) -> int:
    """A tensor's bytes, without importing torch (inspect reads the zip alone)."""
    return math.prod(spec["shape"]) * ITEM_SIZES[spec["dtype"]]


def _precision_text(model: dict[str, Any]) -> str:
    precision = model["precision"]
    if precision == "int8":
        return "int8 weights and activations (PT2E, calibrated)"
    if not model["quantized_layers"]:
        return str(precision)
    group = f" (group size {model['group_size']})" if model["group_size"] else ""
    left = f", {len(model['left_in_bfloat16'])} left in bfloat16" if model["left_in_bfloat16"] else ""
    inputs = "their inputs rounded to int8 at each call, bfloat16 between them" if precision == "int8-dynamic" else "bfloat16 activations"
    shared = f" ({len(model['shared_input'])} sets taking one input, each multiplied as one)" if model["shared_input"] else ""
    return f"{precision.split('-')[0]} weights{group}, {inputs}; {len(model['quantized_layers'])} linear layers quantized{shared}{left}"


def _wheel_summary(wheel: Wheel, manifest: Manifest) -> dict[str, Any]:
    artifacts = [a for model in manifest["models"].values() for a in model["artifacts"]]
    return {
        "wheel": wheel.path.name,
        "tags": wheel.tags,
        "platform_tags": sorted({tag.rsplit("-", 1)[1] for tag in wheel.tags}),
        "requires_torch": _torch_requirement(wheel),
        "requires_dist": wheel.requires_dist(),
        "compiled_with": sorted({_short_torch(a["built_with"]) for a in artifacts}),
        "python": sorted({a["built_with"]["python"] for a in artifacts}),
        "built_by": manifest.get("built_by", "an unknown version"),
        "package": manifest["package"],
    }


def _artifact_rows(manifest: Manifest) -> list[dict[str, Any]]:
    rows = []
    for name, model in sorted(manifest["models"].items()):
        for artifact in model["artifacts"]:
            rows.append(
                {
                    "model": name,
                    "artifact": artifact["file"],
                    "cpu_target": artifact["cpu_target"],
                    "cpu_features": artifact["cpu_features"],
                    "forms": [*(["cpp"] if has_cpp_form(artifact) else []), *(["lean"] if is_lean_only(artifact) else ["lean", "artifact"] if has_lean_form(artifact) else ["artifact"])],
                    "lean_file": artifact["lean"].get("file"),
                    "lean_refused": artifact["lean"].get("refused"),
                    "cpp_file": artifact.get("cpp", {}).get("file"),
                    "cpp_refused": artifact.get("cpp", {}).get("refused"),
                    "torch_free": is_torch_free(artifact),
                    "torch_free_refused": artifact.get("cpp", {}).get("torch_free_refused"),
                    "specialized": artifact["specialized"],
                    "shape": _shape_text(model, artifact),
                    "size": artifact["size"] + sum(model["kernels"][key]["size"] for key in artifact["kernels"]) + artifact.get("cpp", {}).get("size", 0),
                    "kernels": len(artifact["kernels"]),
                    "torch": artifact["built_with"]["torch"],
                    "torch_git": artifact["built_with"]["torch_git"],
                    "native": artifact["native"],
                }
            )
    return rows


def _forms_text(row: dict[str, Any]) -> str:
    if row["forms"] == ["lean"]:
        text = "lean only (int8: its constants instead of an artifact)"
    else:
        text = "lean + artifact" if row["lean_file"] else f"artifact only (lean form refused: {row['lean_refused']})"
    if row["torch_free"]:
        return f"C++ (torch-free) + {text}"
    if row["cpp_file"]:
        return f"C++ + {text}" + (f" (torch-free form refused: {row['torch_free_refused']})" if row["torch_free_refused"] else "")
    return f"{text} (C++ form refused: {row['cpp_refused']})" if row["cpp_refused"] else text


# ---------------------------------------------------------------------------
# verify


def verify(args: argparse.Namespace) -> int:
    """Check WHEEL's files; say which artifact each model would load here, or why none.

    Files: the manifest against the digest in _build.py; every file the manifest
    lists against its size and sha256, and each artifact's header against the
    torch key the manifest records (what the loader checks before loading); the
    loader's own modules and _build.py against the wheel's RECORD.

    What would load here is decided by the loader's own code, so it honours
    HATCH_PRECOMPILE_CPU_TARGET, HATCH_PRECOMPILE_FORM and ATEN_CPU_CAPABILITY as
    the loader would. That needs torch: its version and git revision, the CPU
    features it reports, the kernels it uses, the libstdc++ it loads; so verify
    imports the torch of this Python environment (and nothing from the wheel).

    exit status: 0 every file verifies and every model has an artifact that loads
    here; 1 a file fails, or a model would fall back; 2 WHEEL is not a wheel built
    with the hook.
    """
    wheel = open_wheel(args.wheel)
    manifest, files = _verify_files(wheel)
    models, here = _what_loads_here(manifest)
    ok = all(f["ok"] for f in files) and all(m["loads"] for m in models.values())
    if args.json:
        print_json({"wheel": wheel.path.name, "ok": ok, "files": files, "here": here, "models": models})
        return OK if ok else FAILED

    print(wheel.path.name)
    failed = [f for f in files if not f["ok"]]
    against = {where: sum(f["checked_against"] == where for f in files) for where in ("_build.py", "manifest", "RECORD")}
    print(
        f"files: {len(files) - len(failed)} of {len(files)} verify (the manifest against _build.py's digest, "
        f"{against['manifest']} against the manifest, {against['RECORD']} against the wheel's RECORD)"
    )
    for file in failed:
        print(f"  FAILED {file['file']}: {file['problem']}")
    print(f"here: {here['summary']}")
    print()
    rows = []
    for name, result in models.items():
        for choice in result["choices"]:
            rows.append([name, choice["file"], choice["form"], choice["shape"], choice["cpu_target"]])
        if not result["loads"]:
            rows.append([name, "nothing", f"fallback: {result['fallback']}", "", ""])
    print(table(["model", "would load", "form", "shape variant", "CPU target"], rows))
    for name, result in models.items():
        if result["loads"]:
            for note in sorted({c["form_note"] for c in result["choices"] if c["form_note"]}):
                print(f"{name}: artifact form: {note}")
        else:
            print(f"{name}: {result['reason']}")
    print()
    print("OK: every file verifies and every model loads here" if ok else "FAILED: " + _failure_summary(failed, models))
    return OK if ok else FAILED


def _failure_summary(failed: list[dict[str, Any]], models: dict[str, Any]) -> str:
    parts = [f"{len(failed)} file(s) fail"] if failed else []
    falling_back = [name for name, result in models.items() if not result["loads"]]
    if falling_back:
        parts.append(f"no compiled artifact loads here for {', '.join(falling_back)}")
    return "; ".join(parts)


def _verify_files(wheel: Wheel) -> tuple[Manifest | None, list[dict[str, Any]]]:
    """(the manifest if it matches its digest, else None; one result per file under _precompiled/)."""
    manifest, results = _verify_manifest(wheel)
    names = set(wheel.archive.namelist())
    for record in _manifest_records(wheel.raw_manifest()):
        name = wheel.precompiled + record["file"]
        problem = _listed_file_problem(wheel, record) if name in names else "missing from the wheel"
        results.append(_file_result(name, "manifest", problem))
    checked = {r["file"] for r in results}
    record_file = _read_record(wheel)
    for name in sorted(names):
        if name.startswith(wheel.precompiled) and not name.endswith("/") and name not in checked:
            problem = _record_mismatch(wheel, name, *record_file[name]) if name in record_file else "listed in neither the manifest nor RECORD"
            results.append(_file_result(name, "RECORD", problem))
    return manifest, sorted(results, key=lambda r: r["file"])


def _file_result(name: str, against: str, problem: str) -> dict[str, Any]:
    return {"file": name, "checked_against": against, "ok": not problem, "problem": problem}


def _verify_manifest(wheel: Wheel) -> tuple[Manifest | None, list[dict[str, Any]]]:
    """The manifest checked against the digest in _build.py, as the loader checks it."""
    from ..runtime import PrecompiledModelError
    from ..runtime._manifest import checked_manifest

    name, build = wheel.precompiled + MANIFEST_FILE, wheel.precompiled + BUILD_MODULE
    digest = _recorded_digest(wheel.read(build)) if build in wheel.archive.namelist() else None
    if digest is None:
        return None, [_file_result(name, "_build.py", f"{build} is missing or records no MANIFEST_SHA256; the loader refuses this manifest")]
    try:
        return checked_manifest(wheel.read(name), digest, name), [_file_result(name, "_build.py", "")]
    except PrecompiledModelError as error:  # PrecompiledIntegrityError is one
        return None, [_file_result(name, "_build.py", str(error).removeprefix(f"{name} "))]


def _listed_file_problem(wheel: Wheel, record: Mapping[str, Any]) -> str:
    """How a file the manifest lists differs from its record (size, sha256, and for
    an artifact its header's torch key), as the loader checks it; "" if it matches."""
    from ..engine.assemble import weights_checksums
    from ..runtime._integrity import digest_mismatch
    from ..runtime._torch_private import ArtifactFormatError, split_artifact

    try:
        data = wheel.read(wheel.precompiled + record["file"])
    except CommandError as error:
        return f"cannot be read from the archive: {error.__cause__}"
    problem = digest_mismatch(len(data), hashlib.sha256(data).hexdigest(), record)
    if not problem and "chunk_checksums" in record and weights_checksums(data, record["chunk_size"]) != record["chunk_checksums"]:
        problem = "a chunk's checksum, which the loader checks, differs from the manifest's"  # a build defect
    if not problem and "torch_key" in record.get("built_with", {}) and "constants" not in record:  # an artifact
        try:
            key, _ = split_artifact(data)
        except ArtifactFormatError as error:
            return str(error)
        if key.hex() != record["built_with"]["torch_key"]:
            problem = f"written by another torch build than the manifest says (torch key {key.hex()[:16]}...)"
    return problem and f"does not match the manifest ({problem})"


def _record_mismatch(wheel: Wheel, name: str, expected_hash: str, expected_size: str) -> str:
    """How a file differs from its line in the wheel's RECORD; "" if it matches."""
    try:
        data = wheel.read(name)
    except CommandError as error:
        return f"cannot be read from the archive: {error.__cause__}"
    actual = record_hash(hashlib.sha256(data).digest())
    if actual == expected_hash and expected_size == str(len(data)):
        return ""
    return f"does not match the wheel's RECORD (size {len(data)}, expected {expected_size}; sha256 {'matches' if actual == expected_hash else 'differs'})"


def _manifest_records(manifest: Manifest) -> list[Mapping[str, Any]]:
    """Every file the manifest lists with its size and sha256."""
    records: list[Mapping[str, Any]] = []
    for model in manifest["models"].values():
        if "file" in model["weights"]:
            records.append(model["weights"])
        for artifact in model["artifacts"]:
            records.append(artifact)
            if "file" in artifact["lean"]:
                records.append(artifact["lean"])
            if has_cpp_form(artifact):
                records.append(artifact["cpp"])
                if "ops" in artifact["cpp"]:
                    records.append(artifact["cpp"]["ops"])
        records.extend(model["kernels"].values())
    records.extend(manifest[key] for key in ("shim", "openmp") if key in manifest)  # the wheel's own shim, where a model is torch-free
    return list({r["file"]: r for r in records}.values())


def _recorded_digest(source: bytes) -> str | None:
    """MANIFEST_SHA256 from a wheel's generated _build.py, read without running it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["MANIFEST_SHA256"] and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def _read_record(wheel: Wheel) -> dict[str, tuple[str, str]]:
    name = wheel.dist_info + "RECORD"
    if not wheel.dist_info or name not in wheel.archive.namelist():
        return {}
    rows = csv.reader(io.StringIO(wheel.read(name).decode("utf-8", "replace")))
    return {row[0]: (row[1], row[2]) for row in rows if len(row) == 3}


def _what_loads_here(manifest: Manifest | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per model: the loader's own choice for this process (`plan`), or why none."""
    from ..runtime import _choice as loader
    from ..runtime import _manifest

    if manifest is None:
        return {}, {"summary": "not decided: the loader refuses a manifest that does not match its digest"}
    try:
        here = _manifest.running_environment()  # imports torch: the decision is made from the running torch
    except ImportError as error:
        reason = f"torch cannot be imported here ({error})"
        models = {name: _unloadable(model, reason) for name, model in sorted(manifest["models"].items())}
        return models, {"summary": reason}
    glibc = _manifest.running_glibc()
    summary = (
        f"torch {here['torch']} (git {here['torch_git'][:12]}), cp{here['python'].replace('.', '')} {here['platform']}, "
        f"{here['aten_capability']} kernels, glibc {glibc or 'none'} (torch imported to decide, as the loader does)"
    )
    environment = {**here, "cpu_features": sorted(here["cpu_features"]), "glibc": glibc, "summary": summary}
    models = {}
    for name, model in sorted(manifest["models"].items()):
        try:
            how = loader.plan(name, manifest)
        except ValueError as error:  # e.g. HATCH_PRECOMPILE_FORM set to something else than auto, cpp, lean or artifact
            raise CommandError(str(error)) from None
        if not how.choices:
            models[name] = _unloadable(model, how.reason)
            continue
        choices = []
        for choice in how.choices:
            choices.append(
                {
                    "file": choice.file,
                    "form": choice.form,
                    "form_note": loader.why_form(choice).removeprefix("; "),
                    "shape": _shape_text(model, choice.artifact),
                    "cpu_target": choice.artifact["cpu_target"],
                }
            )
        models[name] = {"loads": True, "choices": choices, "reason": "", "fallback": model["fallback"]}
    return models, environment


def _unloadable(model: ModelEntry, reason: str) -> dict[str, Any]:
    return {"loads": False, "choices": [], "reason": reason, "fallback": model["fallback"]}
