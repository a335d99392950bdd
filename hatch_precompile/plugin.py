"""The build hook: validate, compile each model in a child process, hand files to hatchling.

Cheap to construct (hatchling builds it just to ask for dependencies) and keeps
torch out of the build backend's process: compile work happens in
`hatch_precompile.worker`. Scratch space is a private temporary directory that
is removed when the wheel is written, when anything fails, and at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

from .assemble import RUNTIME_DIR, RUNTIME_FILES, PRECOMPILED_DIR, assemble, runtime_requirements, torch_version, wheel_tag
from .config import TABLE, ConfigError, ModelConfig, parse_config
from .errors import BuildEnvironmentError, ModelBuildError
from .worker import PROGRESS_PREFIX, RESULT_FILE

_NOT_PACKAGES = {"tests", "test", "docs", "examples", "benchmarks", "scripts"}


class PrecompileBuildHook(BuildHookInterface):
    PLUGIN_NAME = "precompile"

    _staging: Path | None = None

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        config = parse_config(self.config)
        requirements = runtime_requirements()
        build_data["dependencies"].extend(requirements)
        if self.target_name != "wheel":
            return  # the sdist carries the same pins and no compiled files
        self._check_sdist_pins(requirements)
        if version == "editable":
            self.app.display_info(
                "precompile: editable install, models are not compiled; load_compiled() falls back per `fallback`"
            )
            return

        package, package_dir = self._find_package(config.package)
        self._check_source_loader(package_dir)
        self.app.display_info(f"precompile: compiling with torch {torch_version()}; the wheel requires {requirements[0]}")

        self._staging = Path(tempfile.mkdtemp(prefix="hatch-precompile-"))  # mode 0700, unpredictable name
        atexit.register(shutil.rmtree, self._staging, ignore_errors=True)
        try:
            import_paths = list(dict.fromkeys([str(package_dir.parent), self.root]))
            entries = {m.name: self._compile(m, import_paths) for m in config.models.values()}
            fallback = {m.name: m.fallback for m in config.models.values()}
            build_data["force_include"].update(assemble(self._staging, package, fallback, entries))
        except BaseException:
            self._remove_staging()
            raise
        build_data["pure_python"] = False
        build_data["tag"] = wheel_tag([a["native"]["policy"] for entry in entries.values() for a in entry["artifacts"]])

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        self._remove_staging()

    def _remove_staging(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    def _compile(self, model: ModelConfig, import_paths: list[str]) -> dict[str, Any]:
        assert self._staging is not None
        out_dir = self._staging / model.name
        out_dir.mkdir()
        request = self._staging / f"{model.name}.request.json"
        request.write_text(
            json.dumps({"model": model.to_json(), "out_dir": str(out_dir), "import_paths": import_paths}), encoding="utf-8"
        )
        log_path = self._staging / f"{model.name}.log"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(self._staging / "inductor-cache")}
        started = time.perf_counter()
        with log_path.open("w") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "hatch_precompile.worker", str(request)],
                cwd=self.root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # so that an interrupt can end its compile pool too
            )
            try:
                assert worker.stdout is not None
                for line in worker.stdout:
                    if line.startswith(PROGRESS_PREFIX):
                        step = json.loads(line[len(PROGRESS_PREFIX) :])
                        timing = "" if step["seconds"] is None else f" ({step['seconds']:.1f} s)"
                        self.app.display_info(f"precompile: {model.name}: {step['step']}{timing}")
                    else:
                        log.write(line)
                worker.wait()
            finally:
                _end_process_group(worker)
        result_path = out_dir / RESULT_FILE
        result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else None
        if worker.returncode != 0 or result is None or "entry" not in result:
            if result and "error" in result:
                raise ModelBuildError(model.name, result["error"]["step"], result["error"]["message"])
            tail = log_path.read_text(errors="replace")[-3000:]
            raise ModelBuildError(model.name, "compiling", f"the compile worker exited with {worker.returncode}:\n{tail}")
        result_path.unlink()
        self.app.display_success(f"precompile: {model.name}: done in {time.perf_counter() - started:.1f} s")
        return result["entry"]

    def _find_package(self, configured: str | None) -> tuple[str, Path]:
        root = Path(self.root)
        bases = [root / "src", root]
        if configured is not None:
            for base in bases:
                if (base / configured / "__init__.py").is_file():
                    return configured, base / configured
            raise ConfigError([f"{TABLE}.package: no package {configured!r} at src/{configured}/ or {configured}/"])
        found = sorted(
            {p.parent for base in bases for p in base.glob("*/__init__.py") if p.parent.name not in _NOT_PACKAGES}
        )
        if len(found) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise ConfigError([f"{TABLE}.package: missing; set it to the import package that receives the models (found: {names})"])
        return found[0].name, found[0]

    def _check_source_loader(self, package_dir: Path) -> None:
        """The wheel always gets this plugin's loader; warn when the source tree's copy
        (used in checkouts and editable installs) is missing or from another version."""
        source_dir = package_dir / PRECOMPILED_DIR
        stale = [n for n in RUNTIME_FILES if not (source_dir / n).is_file() or (source_dir / n).read_bytes() != (RUNTIME_DIR / n).read_bytes()]
        if stale:
            self.app.display_warning(
                f"precompile: {source_dir.relative_to(self.root)}/ is missing or differs from this hatch-precompile's loader "
                f"({', '.join(stale)}); the wheel gets the current one. For source checkouts and editable installs, "
                f"run `python -m hatch_precompile init {package_dir.relative_to(self.root)}` and commit the result."
            )

    def _check_sdist_pins(self, requirements: list[str]) -> None:
        """A wheel built from an sdist must keep the sdist's torch pin (PEP 643)."""
        pkg_info = Path(self.root) / "PKG-INFO"
        if not pkg_info.is_file():
            return
        pins = [line.split(":", 1)[1].strip() for line in pkg_info.read_text(encoding="utf-8").splitlines() if line.startswith("Requires-Dist: torch==")]
        if pins and requirements[0] not in pins:
            raise BuildEnvironmentError(
                f"hatch-precompile: this sdist was made with {pins[0]} but the build environment has torch {torch_version()}; "
                f"build it with {pins[0]} (add it to [build-system] requires, or see the README on choosing torch)",
            )


def _end_process_group(process: subprocess.Popen[str]) -> None:
    """Stop the worker and everything it started (inductor's compile pool)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
