"""Parts and cache entries refused before any compile, each with its message.

Real folders and files, the real configuration parser; nothing here imports
torch or builds (the end-to-end cases are in test_build_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hatch_precompile.engine.cache import EntryStore, plugin_fingerprint
from hatch_precompile.engine.config import TABLE, ConfigError, parse_config
from hatch_precompile.engine.parts import PART_FILE, PART_FORMAT, read_parts
from hatch_precompile.engine.pipeline import compile_part
from hatch_precompile.engine.settings import resolve_settings
from hatch_precompile.engine.sources import ArtifactSources, Claim, PartMismatch

MODEL = {"factory": "pkg.models:build", "inputs": [{"shape": ["batch", 8]}], "dims": {"batch": {"min": 1, "max": 16}}}
CONFIG = parse_config({"models": {"m": MODEL}})
HERE = {"torch": "2.13.0+cpu", "torch_git": "abc", "torch_key": "00", "python": "3.11", "platform": "linux-x86_64", "machine": "x86_64"}


def write_part(folder: Path, *, plugin: str | None = None, models: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    held = {"m": {"config": CONFIG.models["m"].to_json(), "artifacts": {"cpu_avx2.bin": {"key": "k1", "built_with": HERE}}}}
    part = {"format": PART_FORMAT, "plugin": plugin or plugin_fingerprint(), "models": held if models is None else models}
    (folder / PART_FILE).write_text(json.dumps(part))
    return folder


def problems(folders: list[Path]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        read_parts(folders, CONFIG)
    return caught.value.problems


def test_a_good_part_gives_its_claims(tmp_path: Path) -> None:
    part = write_part(tmp_path / "p")
    assert read_parts([part], CONFIG) == {"m": {"cpu_avx2.bin": Claim("k1", part, HERE)}}


def test_every_bad_part_is_named_at_once(tmp_path: Path) -> None:
    other_plugin = write_part(tmp_path / "old", plugin="0" * 64)
    undeclared = write_part(tmp_path / "extra", models={"ranker": {"config": {}, "artifacts": {}}})
    changed = CONFIG.models["m"].to_json() | {"dims": {}}
    reconfigured = write_part(tmp_path / "changed", models={"m": {"config": changed, "artifacts": {}}})
    found = problems([tmp_path / "missing", other_plugin, undeclared, reconfigured])
    assert found == [
        f"HATCH_PRECOMPILE_PARTS: {tmp_path / 'missing'} is not a part (part.json: "
        f"[Errno 2] No such file or directory: '{tmp_path / 'missing' / PART_FILE}'); make one with `hatch-precompile compile-part`",
        f"part {other_plugin} was made by another hatch-precompile than this build's; make parts with the same hatch-precompile as the wheel build (pin it in [build-system] requires)",
        f"part {undeclared} holds model 'ranker', which {TABLE}.models does not declare",
        f"part {reconfigured}: model 'm' was compiled from another configuration ({TABLE}.models.m.dims differ); rebuild the part",
    ]


def test_a_part_compiled_before_quantize_was_set_is_refused_by_its_keys(tmp_path: Path) -> None:
    """quantize and calibration decide what is compiled, as inputs do: a part made
    without them is refused here, by their TOML keys, not later at the key."""
    before = write_part(tmp_path / "float")
    int8 = parse_config({"models": {"m": MODEL | {"quantize": "int8", "calibration": "pkg.data:batches"}}})
    with pytest.raises(ConfigError) as caught:
        read_parts([before], int8)
    assert caught.value.problems == [f"part {before}: model 'm' was compiled from another configuration ({TABLE}.models.m.quantize, {TABLE}.models.m.calibration differ); rebuild the part"]


def test_only_the_configuration_an_artifact_is_compiled_from_must_match(tmp_path: Path) -> None:
    relaxed = CONFIG.models["m"].to_json() | {"fallback": "error", "outputs": "plain", "weights": "factory"}
    part = write_part(tmp_path / "p", models={"m": {"config": relaxed, "artifacts": {}}})
    assert read_parts([part], CONFIG) == {}  # accepted; it holds no artifacts


def test_two_parts_holding_one_artifact_differently_are_refused(tmp_path: Path) -> None:
    first = write_part(tmp_path / "a")
    second = write_part(tmp_path / "b")
    data = json.loads((second / PART_FILE).read_text())
    data["models"]["m"]["artifacts"]["cpu_avx2.bin"]["key"] = "k2"
    (second / PART_FILE).write_text(json.dumps(data))
    assert problems([first, second]) == [f"parts {first} and {second} both hold m/cpu_avx2.bin, compiled from different graphs or environments"]


def stored_entry(store: EntryStore, key: str, tmp_path: Path) -> dict:
    """An artifact with one kernel, kept in `store` under `key`."""
    model_dir = tmp_path / "built"
    (model_dir / "kernels").mkdir(parents=True)
    (model_dir / "cpu_avx2.bin").write_bytes(b"artifact")
    (model_dir / "kernels" / "k_abc.so").write_bytes(b"kernel")
    entry = {"file": "cpu_avx2.bin", "kernels": ["abc"], "lean": {"refused": "test"}}
    store.store(key, model_dir, entry)
    return entry


def test_a_cache_entry_round_trips_and_a_damaged_one_is_a_miss_and_removed(tmp_path: Path) -> None:
    cache = EntryStore(tmp_path / "cache")
    entry = stored_entry(cache, "ab" * 32, tmp_path)
    assert cache.fetch("ab" * 32, tmp_path / "out") == entry
    assert (tmp_path / "out" / "kernels" / "k_abc.so").read_bytes() == b"kernel"
    (tmp_path / "cache" / "ab" / ("ab" * 32) / "kernels" / "k_abc.so").write_bytes(b"kernel, changed")
    assert cache.fetch("ab" * 32, tmp_path / "again") is None
    assert not (tmp_path / "cache" / "ab" / ("ab" * 32)).exists()


def test_a_part_whose_artifact_does_not_match_says_why(tmp_path: Path) -> None:
    part = EntryStore(tmp_path / "part")
    stored_entry(part, "cd" * 32, tmp_path)
    other_torch = HERE | {"torch": "2.14.1", "torch_key": "11"}
    sources = ArtifactSources({"cpu_avx2.bin": Claim("cd" * 32, part.root, other_torch)}, cache=None, keep=None)
    with pytest.raises(PartMismatch) as caught:
        sources.fetch("ef" * 32, "cpu_avx2.bin", tmp_path / "out", HERE)
    assert str(caught.value) == (
        f"part {part.root} holds cpu_avx2.bin, but it was compiled in another environment: torch '2.14.1' there, "
        f"'2.13.0+cpu' here; torch_key '11' there, '00' here; rebuild the part from this project and environment, "
        "or leave it out to compile cpu_avx2.bin here"
    )

    (part.root / "cd" / ("cd" * 32) / "cpu_avx2.bin").write_bytes(b"damaged")
    with pytest.raises(PartMismatch, match=r"the entry for cpu_avx2.bin is missing or damaged \(a file's sha256 differs\)"):
        sources.fetch("cd" * 32, "cpu_avx2.bin", tmp_path / "out", HERE)
    assert (part.root / "cd" / ("cd" * 32)).is_dir()  # the user's part is left as it is


def test_compile_part_wants_a_new_folder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(f'[{TABLE}.models.m]\nfactory = "pkg.models:build"\ninputs = [{{ shape = ["batch", 8] }}]\ndims = {{ batch = {{ min = 1, max = 16 }} }}\n')
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept").write_text("")
    with pytest.raises(ConfigError, match=r"--out .*: not empty; give each part a new folder"):
        compile_part(project, tmp_path / "out")
    assert (tmp_path / "out" / "kept").is_file()


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_worker_count_in_the_environment_is_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HATCH_PRECOMPILE_JOBS", value)
    with pytest.raises(ConfigError) as caught:
        resolve_settings(CONFIG)
    assert caught.value.problems == [f"HATCH_PRECOMPILE_JOBS: expected a whole number of workers, 1 or more, found {value!r}"]


def test_a_part_file_that_is_not_a_record_is_refused_as_another_plugins(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / PART_FILE).write_text("[]")
    assert problems([folder]) == [
        f"part {folder} was made by another hatch-precompile than this build's; make parts with the same hatch-precompile as the wheel build (pin it in [build-system] requires)"
    ]
