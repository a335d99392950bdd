"""The command line: `check` on projects, `inspect` and `verify` on real wheels.

The e2e tests read the example wheel built by the real hook, and copies of it
changed the way a fault (or a consistent but wrong build) would change them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from hatch_precompile.cli import main
from hatch_precompile.engine.assemble import RUNTIME_DIR, RUNTIME_FILES

from conftest import EXAMPLE, REPO, ExampleBuild, reseal

PRECOMPILED = "example_pkg/_precompiled/"


def manifest_of(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read(PRECOMPILED + "manifest.json"))


def files_line(wheel: Path, failing: int = 0) -> str:
    """verify's summary of the file checks: the manifest (against _build.py), every
    file it lists, and every other file under _precompiled/ (the loader's modules
    and _build.py, against RECORD)."""
    model = manifest_of(wheel)["models"]["encoder"]
    listed = 1 + len(model["artifacts"]) * 3 + len(model["kernels"])  # weights, artifacts, lean modules, C++ libraries, kernels
    with zipfile.ZipFile(wheel) as archive:
        total = sum(name.startswith(PRECOMPILED) and not name.endswith("/") for name in archive.namelist())
    return f"files: {total - failing} of {total} verify (the manifest against _build.py's digest, {listed} against the manifest, {total - listed - 1} against the wheel's RECORD)"


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def rewrite_wheel(source: Path, folder: Path, changes: dict[str, bytes], *, update_record: bool) -> Path:
    """A copy of `source` (same file name, in `folder`) with some files' bytes
    replaced; with `update_record`, RECORD is rewritten to match, as a build would."""
    folder.mkdir(exist_ok=True)
    target = folder / source.name
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = changes.get(info.filename, old.read(info.filename))
            if update_record and info.filename.endswith(".dist-info/RECORD"):
                data = _updated_record(data.decode(), changes).encode()
            new.writestr(info, data)
    return target


def _updated_record(record: str, changes: dict[str, bytes]) -> str:
    lines = []
    for line in record.splitlines():
        name = line.split(",")[0]
        if name in changes:
            digest = base64.urlsafe_b64encode(hashlib.sha256(changes[name]).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(changes[name])}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def resealed(wheel: Path, folder: Path, edit) -> Path:
    """A copy of `wheel` whose manifest `edit` changed, with the digest in _build.py
    and RECORD kept consistent (conftest's `reseal`, then back into the zip)."""
    manifest = manifest_of(wheel)
    edit(manifest)
    staging = folder / "staging"
    staging.mkdir(parents=True)
    reseal(staging / "manifest.json", manifest)
    changes = {PRECOMPILED + name: (staging / name).read_bytes() for name in ("manifest.json", "_build.py")}
    return rewrite_wheel(wheel, folder / "wheel", changes, update_record=True)


# --- check ------------------------------------------------------------------


def test_check_accepts_the_example_project_and_summarises_its_models(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "check", EXAMPLE)
    assert code == 0, out
    assert "valid; 1 model(s) for package example_pkg" in out
    header, row = out.splitlines()[1:3]
    assert header.split() == ["model", "factory", "inputs", "dims", "CPU", "targets", "artifacts", "weights", "fallback"]
    assert row.split() == ["encoder", "example_pkg.model:build_encoder", "int64[batch,", "64]", "batch", "1-64", "avx2", "1", "embed", "eager"]


def test_check_lists_every_problem_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (EXAMPLE / "pyproject.toml").read_text()
    broken = text.replace('fallback = "eager"', 'fallback = "eagr"').replace('dtype = "int64"', 'dtype = "int46"')
    assert broken.count("eagr") == 1 and broken.count("int46") == 1
    (tmp_path / "pyproject.toml").write_text(broken)

    code, out, _ = cli(capsys, "check", tmp_path)
    assert code == 1
    assert "2 problem(s)" in out
    assert "tool.hatch.build.hooks.precompile.fallback: expected one of 'eager', 'error', found a string 'eagr'" in out
    assert "tool.hatch.build.hooks.precompile.models.encoder.inputs[0].dtype:" in out and "'int46' (did you mean 'int64'?)" in out

    code, out, _ = cli(capsys, "check", "--json", tmp_path)
    document = json.loads(out)
    assert code == 1 and document["valid"] is False and len(document["problems"]) == 2 and document["config"] is None


def test_check_refuses_unsupported_inductor_options_before_anything_compiles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (EXAMPLE / "pyproject.toml").read_text()
    assert text.count("options = {}") == 1
    (tmp_path / "pyproject.toml").write_text(text.replace("options = {}", "options = { freezing = true, no_such_option = 1 }"))
    code, out, _ = cli(capsys, "check", tmp_path)
    assert code == 1 and "2 problem(s)" in out
    assert "tool.hatch.build.hooks.precompile.models.encoder.options.freezing: not supported: the graph takes its weights as inputs" in out
    assert "tool.hatch.build.hooks.precompile.models.encoder.options.no_such_option: not an inductor option hatch-precompile supports" in out


def test_check_names_each_int8_conflict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (EXAMPLE / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace("options = {}", 'options = {}\nquantize = "int8"\ndtype = "float16"'))
    code, out, _ = cli(capsys, "check", tmp_path)
    assert code == 1 and "1 problem(s)" in out
    assert "tool.hatch.build.hooks.precompile.models.encoder.dtype: is 'float16', but `quantize = \"int8\"` quantizes the float32 module" in out


def test_check_says_clearly_when_there_is_no_table_or_no_project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1"\n')
    code, out, _ = cli(capsys, "check", tmp_path)
    assert code == 1
    assert "no [tool.hatch.build.hooks.precompile] table" in out
    assert "warning: build-system.requires lacks 'hatch-precompile'" in out

    code, out, err = cli(capsys, "check", tmp_path / "elsewhere")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"hatch-precompile check: error: {tmp_path / 'elsewhere' / 'pyproject.toml'}: no such file; PROJECT_DIR must be the project's folder"]


def test_check_json_describes_the_valid_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "check", "--json", EXAMPLE)
    document = json.loads(out)
    assert code == 0 and document["valid"] is True and document["problems"] == []
    encoder = document["config"]["models"]["encoder"]
    assert encoder["factory"] == "example_pkg.model:build_encoder" and encoder["cpu_targets"] == ["avx2"]


def test_check_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from hatch_precompile.cli import main\n"
        f"code = main(['check', {str(EXAMPLE)!r}])\n"
        "print('torch imported:', sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
        "raise SystemExit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid" in result.stdout and "torch imported: []" in result.stdout


# --- init, the entry points, errors -------------------------------------------------


def test_python_dash_m_runs_init_as_before(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    result = subprocess.run([sys.executable, "-m", "hatch_precompile", "init", str(package)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert f"wrote {package / '_precompiled'}/" in result.stdout
    for name in RUNTIME_FILES:
        assert (package / "_precompiled" / name).read_bytes() == (RUNTIME_DIR / name).read_bytes()

    result = subprocess.run([sys.executable, "-m", "hatch_precompile", "init", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.strip() == f"python -m hatch_precompile init: error: {tmp_path} is not a package folder (no __init__.py)"


def test_the_console_script_is_the_cli_main() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"hatch-precompile": "hatch_precompile.cli:main"}


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_what_is_not_a_precompiled_wheel_gets_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    not_named_like_a_wheel = tmp_path / "model.zip"
    not_named_like_a_wheel.write_bytes(b"")
    not_a_zip = tmp_path / "demo-1.0-py3-none-any.whl"
    not_a_zip.write_text("not a zip")
    plain_folder = tmp_path / "plain"
    plain_folder.mkdir()
    plain = plain_folder / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(plain, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    cases = {
        tmp_path / "missing.whl": "no such file",
        not_named_like_a_wheel: "not a wheel (Invalid wheel filename",
        not_a_zip: "not a wheel: not a readable zip archive",
        plain: "no <package>/_precompiled/manifest.json in this wheel: it was not built with the hatch-precompile hook",
    }
    for path, message in cases.items():
        code, out, err = cli(capsys, command, path)
        assert code == 2 and out == ""
        (line,) = err.strip().splitlines()
        assert line.startswith(f"hatch-precompile {command}: error: {path}: ") and message in line, line


# --- inspect and verify on the example wheel ---------------------------------------------


@pytest.mark.e2e
def test_inspect_lists_models_targets_forms_tag_and_torch_pin(example_build: ExampleBuild, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    release = torch.__version__.split("+")[0]
    code, out, _ = cli(capsys, "inspect", example_build.wheel)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == example_build.wheel.name
    assert f"requires:      torch=={release}\n" in out
    tag = example_build.wheel.name.removesuffix(".whl").split("-", 2)[2]
    assert f"platform:      {tag.split('-')[2]} (tag {tag})" in out
    assert f"compiled with: torch {torch.__version__} (git {torch.version.git_version[:12]})" in out
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    assert lines[header].split() == ["model", "artifact", "CPU", "target", "shape", "variant", "size", "load", "forms"]
    row = lines[header + 1]
    assert row.startswith("encoder  encoder/cpu_avx2.bin  avx2")
    assert "dynamic (batch 1-64)" in row and row.endswith("C++ + lean + artifact")
    assert "KiB" in row
    assert lines[-2:] == ["encoder: float32", "  without torch (arrays='numpy'): yes"]

    code, out, _ = cli(capsys, "inspect", "--json", example_build.wheel)
    document = json.loads(out)
    assert code == 0 and document["tags"] == [tag] and document["platform_tags"] == [tag.split("-")[2]]
    assert document["requires_torch"] == f"torch=={release}"
    (artifact,) = document["artifacts"]
    assert artifact["model"] == "encoder" and artifact["cpu_target"] == "avx2" and artifact["forms"] == ["cpp", "lean", "artifact"]
    assert artifact["specialized"] == {} and artifact["torch"] == torch.__version__
    assert document["models"]["encoder"]["without_torch"] == "yes"
    manifest = manifest_of(example_build.wheel)
    kernels = manifest["models"]["encoder"]["kernels"].values()
    variant = manifest["models"]["encoder"]["artifacts"][0]
    assert artifact["size"] == variant["size"] + sum(k["size"] for k in kernels) + variant["cpp"]["size"]


@pytest.mark.e2e
def test_inspect_imports_no_torch(example_build: ExampleBuild) -> None:
    code = f"import sys\nfrom hatch_precompile.cli import main\ncode = main(['inspect', {str(example_build.wheel)!r}])\nprint('torch imported:', 'torch' in sys.modules)\nraise SystemExit(code)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch imported: False" in result.stdout


@pytest.mark.e2e
def test_verify_passes_on_the_example_wheel(example_build: ExampleBuild, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "verify", example_build.wheel)
    assert code == 0, out
    assert files_line(example_build.wheel) in out.splitlines()
    assert "encoder  encoder/cpu_avx2_cpp.so  cpp   dynamic (batch 1-64)  avx2" in out
    assert out.rstrip().endswith("OK: every file verifies and every model loads here")

    code, out, _ = cli(capsys, "verify", "--json", example_build.wheel)
    document = json.loads(out)
    assert code == 0 and document["ok"] is True
    assert all(f["ok"] for f in document["files"]) and f"{len(document['files'])} of {len(document['files'])} verify" in files_line(example_build.wheel)
    against = {f["file"].removeprefix(PRECOMPILED): f["checked_against"] for f in document["files"]}
    assert against["manifest.json"] == "_build.py" and against["encoder/cpu_avx2.bin"] == "manifest"
    assert all(against[name] == "RECORD" for name in [*RUNTIME_FILES, "_build.py"])
    (choice,) = document["models"]["encoder"]["choices"]
    assert choice["file"] == "encoder/cpu_avx2_cpp.so" and choice["form"] == "cpp"


@pytest.mark.e2e
def test_verify_names_a_file_whose_bytes_were_altered(example_build: ExampleBuild, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = PRECOMPILED + "encoder/cpu_avx2.bin"
    with zipfile.ZipFile(example_build.wheel) as archive:
        data = bytearray(archive.read(name))
    data[len(data) // 2] ^= 0xFF
    damaged = rewrite_wheel(example_build.wheel, tmp_path, {name: bytes(data)}, update_record=False)

    code, out, _ = cli(capsys, "verify", damaged)
    assert code == 1
    assert f"  FAILED {name}: does not match the manifest (size {len(data)}, expected {len(data)}; sha256 differs)" in out.splitlines()
    assert files_line(example_build.wheel, failing=1) in out.splitlines()
    assert out.rstrip().endswith("FAILED: 1 file(s) fail")

    code, out, _ = cli(capsys, "verify", "--json", damaged)
    document = json.loads(out)
    assert code == 1 and document["ok"] is False
    assert [f["file"] for f in document["files"] if not f["ok"]] == [name]


@pytest.mark.e2e
def test_verify_names_an_edited_manifest(example_build: ExampleBuild, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = manifest_of(example_build.wheel)
    manifest["models"]["encoder"]["fallback"] = "error"
    edited = rewrite_wheel(example_build.wheel, tmp_path, {PRECOMPILED + "manifest.json": json.dumps(manifest).encode()}, update_record=False)

    code, out, _ = cli(capsys, "verify", edited)
    assert code == 1
    assert f"  FAILED {PRECOMPILED}manifest.json: does not match the digest the build recorded: it was modified" in out.splitlines()


@pytest.mark.e2e
def test_verify_reports_a_model_whose_artifacts_need_a_cpu_feature_this_machine_lacks(example_build: ExampleBuild, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    lacking = sorted(name for name, present in torch.cpu.get_capabilities().items() if present is False)[0]

    def needs_it(manifest: dict) -> None:
        for artifact in manifest["models"]["encoder"]["artifacts"]:
            artifact["cpu_features"].append(lacking)

    wheel = resealed(example_build.wheel, tmp_path, needs_it)
    code, out, _ = cli(capsys, "verify", wheel)
    assert code == 1, out
    assert files_line(wheel) in out.splitlines()  # a consistent build, only for another CPU
    assert ["encoder", "nothing", "fallback:", "eager"] in [line.split() for line in out.splitlines()]
    reason = next(line for line in out.splitlines() if line.startswith("encoder: "))
    assert reason.startswith("encoder: no shipped artifact fits this process: encoder/cpu_avx2.bin was built with torch")
    assert f"CPU lacks {lacking}" in reason
    assert out.rstrip().endswith("FAILED: no compiled artifact loads here for encoder")

    code, out, _ = cli(capsys, "verify", "--json", wheel)
    encoder = json.loads(out)["models"]["encoder"]
    assert code == 1 and encoder["loads"] is False and f"CPU lacks {lacking}" in encoder["reason"]
