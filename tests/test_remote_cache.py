"""The remote build cache against real servers on loopback: Redis (Debian's
redis-server) and an S3-compatible server (moto's server mode), with the real
clients (redis-py, boto3), never mocks of them.

Builds are real builds of a small project by the real hook, each with an empty
local build cache of its own, so that only the remote store can spare a compile.
The failure cases that need no compile (unreachable, wrong credentials, read-only,
damaged objects) use the store's code on real entries directly, and
`hatch-precompile check-cache`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import Server, free_port, s3_client, start_redis, start_s3

from conftest import run, sharing_compiler_outputs, write_project

pytestmark = pytest.mark.e2e  # its own projects and servers: nothing of the session's but the compiler outputs; in the default suite, the line with room

MODELS = '''
import os
import signal

import torch
from torch import nn


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def stops_the_store():
    """Stops the store's server (its pid in STORE_PID) before the build captures
    this model: the store goes down in the middle of the build."""
    os.kill(int(os.environ["STORE_PID"]), signal.SIGKILL)
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
'''

MODEL = """
[tool.hatch.build.hooks.precompile.models.{name}]
factory = "remotepkg.models:{factory}"
inputs = [{{ shape = ["batch", 8] }}]
dims = {{ batch = {{ min = 1, max = 8 }} }}
"""

PROJECT = MODEL.format(name="mlp", factory="mlp")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_s3(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@dataclass
class Build:
    wheel: Path
    log: str


def build(project: Path, server: Server | None, local_cache: Path, url: str | None = None, *, compiles: bool = True, **extra: str) -> Build:
    """`python -m build --wheel` of `project` with the local build cache at
    `local_cache` (new: no artifacts) and the store at `url` (default: the
    server's). A build expected to compile shares the session's compiler outputs
    (`sharing_compiler_outputs`); one that must not gets none, so that a test can
    see it compiled nothing."""
    shutil.rmtree(project / "dist", ignore_errors=True)
    if compiles:
        sharing_compiler_outputs(local_cache)
    env = {**os.environ, "HATCH_PRECOMPILE_BUILD_CACHE": str(local_cache), **(server.env if server else {}), **extra}
    env["HATCH_PRECOMPILE_REMOTE_CACHE"] = url or (server.url if server else "off")
    result = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)], env=env)
    (wheel,) = (project / "dist").glob("*.whl")
    kept = local_cache.parent / f"{local_cache.name}-{wheel.name}"
    shutil.copyfile(wheel, kept)  # the project's dist/ is emptied by the next build
    return Build(kept, result.stdout + result.stderr)


def stored(server: Server) -> dict[str, bytes]:
    """Every object the plugin put in the store, by name."""
    if server.url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(server.url)
        return {name.decode(): client.get(name) for name in client.keys("hatch-precompile/*")}
    s3 = s3_client(server)
    listing = s3.list_objects_v2(Bucket="wheels", Prefix="team-cache/").get("Contents", [])
    return {item["Key"]: s3.get_object(Bucket="wheels", Key=item["Key"])["Body"].read() for item in listing}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("remote"), "remotepkg", MODELS, PROJECT)


@pytest.fixture(scope="module")
def cold_builds(project: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Callable[[str], Build]:
    """The first build against each store, with an empty local cache: it fills the
    store, which the tests then read, damage or build from (one compile per store)."""
    done: dict[str, Build] = {}

    def cold(store: str) -> Build:
        if store not in done:
            server: Server = request.getfixturevalue(f"{store}_server")
            done[store] = build(project, server, tmp_path_factory.mktemp(f"{store}-cold") / "laptop")
        return done[store]

    return cold


@pytest.mark.parametrize("store", ["redis", "s3"])
def test_a_cold_build_fills_the_store_and_a_build_with_an_empty_local_cache_compiles_nothing(
    store: str, project: Path, cold_builds: Callable[[str], Build], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: Server = request.getfixturevalue(f"{store}_server")
    cold = cold_builds(store)
    assert f"precompile: remote cache {server.url} (read-write)" in cold.log
    assert "precompile: 1 model(s) in" in cold.log and "(1 compiled)" in cold.log
    assert f"remote cache {server.url}: 0 hit(s), 1 miss(es), 0.0 MB down," in cold.log
    (name,) = [n for n in stored(server) if n.endswith(".tar")]
    assert name.startswith("team-cache/hatch-precompile/build/" if store == "s3" else "hatch-precompile/build/")

    warm = build(project, server, tmp_path / "ci-runner", compiles=False)
    assert f"mlp: avx2 (dynamic dims): remote {server.url}: cpu_avx2.bin" in warm.log
    assert "(1 from the remote cache)" in warm.log and "compiled" not in warm.log.split("precompile: 1 model(s)")[1]
    assert f"remote cache {server.url}: 1 hit(s), 0 miss(es)" in warm.log
    assert warm.wheel.read_bytes() == cold.wheel.read_bytes()
    assert list((tmp_path / "ci-runner").glob("*/*/entry.json"))  # the hit is in the local cache now
    assert not (tmp_path / "ci-runner" / "compiler" / "vector-isa").exists()  # the warm one compiled nothing, not even those probes


def test_a_damaged_remote_entry_is_a_miss_is_compiled_again_and_replaced(redis_server: Server, project: Path, cold_builds: Callable[[str], Build], tmp_path: Path) -> None:
    import redis

    first = cold_builds("redis")
    client = redis.Redis.from_url(redis_server.url)
    (name,) = client.keys("hatch-precompile/*")
    good = client.get(name)
    assert good is not None
    client.set(name, _with_a_changed_artifact(good))
    again = build(project, redis_server, tmp_path / "second")
    assert "is damaged (ValueError: a file does not match its recorded sha256); compiling it here" in again.log
    assert "(1 compiled)" in again.log
    assert again.wheel.read_bytes() == first.wheel.read_bytes()
    assert client.get(name) == good  # the compile put a whole entry back


def _with_a_changed_artifact(archive: bytes) -> bytes:
    """The tar with one byte of its artifact file changed and entry.json as it was."""
    source, target = io.BytesIO(archive), io.BytesIO()
    with tarfile.open(fileobj=source) as original, tarfile.open(fileobj=target, mode="w") as changed:
        for member in original.getmembers():
            data = original.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(".bin"):
                data = bytes([data[0] ^ 1]) + data[1:]
            changed.addfile(member, io.BytesIO(data))
    return target.getvalue()


def test_a_store_that_stops_in_the_middle_of_a_build_is_said_once_and_the_build_goes_on(tmp_path: Path) -> None:
    server = start_redis(tmp_path)
    try:
        two = write_project(tmp_path / "two", "remotepkg", MODELS, PROJECT + MODEL.format(name="second", factory="stops_the_store"))
        started = time.monotonic()
        result = build(two, server, tmp_path / "local", STORE_PID=str(server.process.pid))
        seconds = time.monotonic() - started
    finally:
        server.stop()
    down = [line for line in result.log.splitlines() if "is unavailable" in line]
    assert len(down) == 1 and "ConnectionError" in down[0], result.log[-3000:]
    assert down[0].endswith("compiling locally, without it for the rest of this build")
    assert "(2 compiled)" in result.log
    assert seconds < 120


def test_two_builds_at_once_with_empty_local_caches_both_succeed_and_leave_one_whole_entry(tmp_path: Path) -> None:
    from hatch_precompile.engine.cache import EntryStore

    server = start_redis(tmp_path)
    projects = {name: write_project(tmp_path / name, "remotepkg", MODELS, PROJECT) for name in ("runner-a", "runner-b")}
    try:
        with ThreadPoolExecutor(2) as pool:
            builds = list(pool.map(lambda name: build(projects[name], server, tmp_path / name / "cache"), projects))
        objects = stored(server)
    finally:
        server.stop()
    assert builds[0].wheel.read_bytes() == builds[1].wheel.read_bytes()
    (name,) = objects
    key = name.rpartition("/")[2].removesuffix(".tar")
    assert EntryStore(tmp_path / "check").adopt(key, objects[name]) is None  # whole, and every sha256 matches


# -- the store's failures, on real servers, without a build ------------------------------

ENTRY = {"file": "cpu_avx2.bin", "kernels": [], "lean": {}}


def an_entry(folder: Path) -> dict:
    """An artifact entry's files as a worker leaves them (the store does not read them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu_avx2.bin").write_bytes(os.urandom(4096))
    return dict(ENTRY)


def check_cache(project: Path, url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HATCH_PRECOMPILE_REMOTE_CACHE": url, **extra}
    command = [str(Path(sys.executable).parent / "hatch-precompile"), "check-cache", str(project)]
    return run(command, env=env, check=False)


def test_check_cache_writes_and_reads_back_a_probe_on_both_stores(redis_server: Server, s3_server: Server, project: Path) -> None:
    for server in (redis_server, s3_server):
        result = check_cache(project, server.url, **server.env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"remote cache: {server.url} (read-write): OK, reached {server.url}, wrote hatch-precompile/build/probe and read it back" in result.stdout
    read_only = check_cache(project, redis_server.url, HATCH_PRECOMPILE_REMOTE_CACHE_MODE="read-only")
    assert "(read-only): OK, reached" in read_only.stdout and "read from it" in read_only.stdout


def test_an_unreachable_store_a_wrong_password_and_a_missing_bucket_are_said_with_the_password_masked(s3_server: Server, project: Path, tmp_path: Path) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    unreachable = check_cache(project, closed)
    assert unreachable.returncode == 1 and time.monotonic() - started < 20
    assert f"remote cache: {closed} (read-write): unavailable: ConnectionError: Error 111 connecting to 127.0.0.1" in unreachable.stdout

    guarded = start_redis(tmp_path, "--requirepass", "right-secret")
    try:
        port = guarded.url.split(":")[2].split("/")[0]
        wrong = check_cache(project, f"redis://:wrong-secret@127.0.0.1:{port}/0")
        right = check_cache(project, f"redis://:right-secret@127.0.0.1:{port}/0")
    finally:
        guarded.stop()
    assert wrong.returncode == 1 and "AuthenticationError" in wrong.stdout, wrong.stdout
    assert f"redis://:***@127.0.0.1:{port}/0" in wrong.stdout and "secret" not in wrong.stdout + wrong.stderr
    assert right.returncode == 0 and "secret" not in right.stdout

    no_bucket = check_cache(project, "s3://no-such-bucket/cache", **s3_server.env)
    assert no_bucket.returncode == 1 and "unavailable: ClientError" in no_bucket.stdout and "404" in no_bucket.stdout


def test_a_store_that_fails_is_said_once_and_then_left_alone(tmp_path: Path) -> None:
    """What a worker does when the store goes away: every later fetch and store
    is a quiet no-op, and the build hears of it once."""
    from hatch_precompile.engine.remote import RemoteCache, RemoteSettings

    server = start_redis(tmp_path)
    remote = RemoteCache(RemoteSettings(server.url))
    entry = an_entry(tmp_path / "model")
    remote.store("a" * 64, tmp_path / "model", entry)  # type: ignore[arg-type]
    assert remote.fetch("a" * 64, tmp_path / "out", None) == entry
    server.stop()
    started = time.monotonic()
    assert remote.fetch("b" * 64, tmp_path / "out", None) is None
    remote.store("c" * 64, tmp_path / "model", entry)  # type: ignore[arg-type]
    assert remote.fetch("a" * 64, tmp_path / "out", None) is None
    assert time.monotonic() - started < 10
    (notice,) = remote.take_notices()
    assert notice.startswith(f"remote cache {server.url} is unavailable (ConnectionError: ")
    assert remote.take_traffic().hits == 1


def test_read_only_takes_entries_and_writes_none(redis_server: Server, tmp_path: Path) -> None:
    from hatch_precompile.engine.remote import RemoteCache, RemoteSettings

    writer = RemoteCache(RemoteSettings(redis_server.url.replace("/0", "/3")))
    reader = RemoteCache(RemoteSettings(writer.settings.url, read_only=True))
    entry = an_entry(tmp_path / "model")
    reader.store("d" * 64, tmp_path / "model", entry)  # type: ignore[arg-type]
    assert reader.fetch("d" * 64, tmp_path / "out", None) is None
    writer.store("d" * 64, tmp_path / "model", entry)  # type: ignore[arg-type]
    assert reader.fetch("d" * 64, tmp_path / "out", None) == entry
    assert (tmp_path / "out" / "cpu_avx2.bin").read_bytes() == (tmp_path / "model" / "cpu_avx2.bin").read_bytes()
    assert reader.take_traffic().bytes_up == 0 and reader.take_notices() == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("another key", "ValueError: it was stored under another key"),
        ("not a tar", "ReadError"),
        ("a path out", "OutsideDestinationError"),
        ("not a record", "ValueError: entry.json is not an entry record"),
        ("a stray file", "ValueError: entry.json lists other files than its entry ships"),
    ],
)
def test_an_object_that_is_not_the_entry_asked_for_is_a_miss(redis_server: Server, tmp_path: Path, change: str, problem: str) -> None:
    """A reader never takes what it did not ask for, nor writes outside its cache."""
    import redis

    from hatch_precompile.engine.remote import RemoteCache, RemoteSettings, pack_entry

    remote = RemoteCache(RemoteSettings(redis_server.url.replace("/0", "/4")))
    entry = an_entry(tmp_path / "model")
    key = "e" * 64
    blob = {
        "another key": pack_entry("f" * 64, tmp_path / "model", entry),  # type: ignore[arg-type]
        "not a tar": b"not a tar",
        "a path out": _tar({"../../outside.txt": b"x"}),
        "not a record": _tar({"entry.json": b"[]"}),
        "a stray file": _tar(
            {
                "cpu_avx2.bin": b"artifact",
                "stray.so": b"code",
                "entry.json": json.dumps({"key": key, "entry": ENTRY, "sha256": {"cpu_avx2.bin": _sha256(b"artifact"), "stray.so": _sha256(b"code")}}).encode(),
            }
        ),
    }[change]
    redis.Redis.from_url(remote.settings.url).set(f"hatch-precompile/build/{key[:2]}/{key}.tar", blob)
    local = tmp_path / "local"
    from hatch_precompile.engine.cache import EntryStore

    assert remote.fetch(key, tmp_path / "out", EntryStore(local)) is None
    (notice,) = remote.take_notices()
    assert f"the entry {key[:12]} is damaged ({problem}" in notice
    assert not (tmp_path / "outside.txt").exists() and not list(local.glob("*/*/entry.json"))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('remote-cache = "redis://:hunter2@cache.internal:6379/0"', "a password in pyproject.toml would be published"),
        ('remote-cache = "http://cache.internal"', "expected a redis://, rediss:// or s3:// URL, found 'http://cache.internal'"),
        ('remote-cache = "s3://"', "names no host (redis) or bucket (s3)"),
        ('remote-cache-mode = "readonly"', "expected one of 'read-write', 'read-only', found a string 'readonly' (did you mean 'read-only'?)"),
    ],
)
def test_bad_remote_settings_in_the_table_are_named(table: str, expected: str) -> None:
    import tomllib

    from hatch_precompile.engine.config import ConfigError, parse_config

    raw = tomllib.loads(table + "\n" + MODEL.format(name="mlp", factory="mlp").replace("[tool.hatch.build.hooks.precompile.models.mlp]", "[models.mlp]"))
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert expected in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_the_environment_overrides_the_table_and_may_carry_the_password() -> None:
    import tomllib

    from hatch_precompile.engine.config import parse_config
    from hatch_precompile.engine.settings import resolve_settings

    raw = tomllib.loads('remote-cache = "redis://cache.internal:6379/0"\n' + MODEL.format(name="mlp", factory="mlp").replace("[tool.hatch.build.hooks.precompile.models.mlp]", "[models.mlp]"))
    config = parse_config(raw)
    assert resolve_settings(config, environ={}).remote.url == "redis://cache.internal:6379/0"  # type: ignore[union-attr]
    secret = resolve_settings(config, environ={"HATCH_PRECOMPILE_REMOTE_CACHE": "rediss://:hunter2@cache.internal:6380/0", "HATCH_PRECOMPILE_REMOTE_CACHE_MODE": "read-only"}).remote
    assert secret is not None and secret.read_only and secret.address == "rediss://:***@cache.internal:6380/0"
    assert resolve_settings(config, environ={"HATCH_PRECOMPILE_REMOTE_CACHE": "off"}).remote is None
