"""The hatch build hook: validate, compile each model in a child process, hand files to hatchling.

Cheap to construct (hatchling builds it just to ask for dependencies) and keeps
torch out of the build backend's process: compile work happens in
`hatch_precompile.worker`. Scratch space is a private temporary directory that
is removed when the wheel is written, when anything fails, and at exit. An
expected failure ends the build with its message alone (engine/errors.py).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

from ..engine.assemble import runtime_requirements
from ..engine.config import parse_config
from ..engine.errors import failures_said_plainly
from ..engine.pipeline import EDITABLE_MESSAGE, Reporter, check_sdist_pins, precompile, ready_source


class PrecompileBuildHook(BuildHookInterface[BuilderConfig]):
    PLUGIN_NAME = "precompile"

    _staging: Path | None = None

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        with failures_said_plainly():
            self._initialize(version, build_data)

    def _initialize(self, version: str, build_data: dict[str, Any]) -> None:
        config = parse_config(self.config)
        requirements = runtime_requirements(config.torch_free)
        build_data["dependencies"].extend(requirements)
        if self.target_name != "wheel":
            return  # the sdist carries the same pins and no compiled files
        check_sdist_pins(Path(self.root), requirements)
        report = Reporter(self.app.display_info, self.app.display_success, self.app.display_warning)
        root = Path(self.root)
        package, package_dir = ready_source(root, config, report)
        if version == "editable":
            report.info(EDITABLE_MESSAGE)
            return

        self._staging = Path(tempfile.mkdtemp(prefix="hatch-precompile-"))  # mode 0700, unpredictable name
        atexit.register(shutil.rmtree, self._staging, ignore_errors=True)
        try:
            precompiled = precompile(root, config, package, package_dir, self._staging, report)
        except BaseException:
            self._remove_staging()
            raise
        build_data["dependencies"].extend(precompiled.extra_requirements)
        build_data["force_include"].update(precompiled.files)
        build_data["pure_python"] = False
        build_data["tag"] = precompiled.tag

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        self._remove_staging()

    def _remove_staging(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
