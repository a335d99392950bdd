"""The remote build cache: Redis or S3-compatible storage behind the local one.

A team's wheels are built on CI runners that start empty, on several machines at
once and on laptops; a store they share saves each of them the compiles another
already did. The store holds one object per artifact: its entry's folder (the
files and `entry.json`, as the local cache holds them) as a tar, under the
artifact's key. An object is written with one put, so a reader sees a whole
entry or none, and two builds that compile the same artifact at once both write
a whole one (the last stays). An object read back is unpacked and checked as a
local entry is (`EntryStore.adopt`: each file's sha256, and the key it was
stored under), so a damaged or foreign entry is a miss, never a file in a wheel.

The store is an accelerator, never a requirement. Any failure to use it (refused,
timed out, throttled, full, wrong credentials, a client library missing) makes
it unavailable for the rest of the build: the build says so once, with the
store's address and its credentials masked, and compiles locally. Clients are
imported only when a store is configured: redis-py (`hatch-precompile[redis]`)
and boto3 (`hatch-precompile[s3]`), which takes the endpoint, region and
credentials the way the AWS tools take them. No torch here.
"""

from __future__ import annotations

import functools
import io
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..runtime._schema import ArtifactEntry
from .cache import ENTRY_FILE, EntryStore, entry_files

SCHEMES = ("redis", "rediss", "s3")
CONNECT_TIMEOUT_S = 3.0  # a store that does not answer this soon is down for this build
IO_TIMEOUT_S = 30.0  # per read or write on an open connection: entries are a few MB at most
KEY_PREFIX = "hatch-precompile/build/"  # every object this plugin writes is named under it
PROBE_KEY = "probe"  # what `hatch-precompile check-cache` writes and reads back


class RemoteUnavailable(Exception):
    """The store cannot be used now; the message says why, credentials masked."""


@dataclass(frozen=True)
class RemoteSettings:
    """Where the remote store is, and whether this build may write to it."""

    url: str  # redis://, rediss:// or s3://; a password in it only from the environment
    read_only: bool = False

    @property
    def address(self) -> str:
        """The URL with any password masked: what the build prints."""
        return masked(self.url)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "read_only": self.read_only}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RemoteSettings:
        return cls(str(data["url"]), bool(data["read_only"]))


def masked(url: str) -> str:
    """`url` with the password in its user part replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***" if parts.username else ":***"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def url_problem(url: str, *, from_table: bool) -> str | None:
    """What is wrong with a configured store URL, or None."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        return f"expected a redis://, rediss:// or s3:// URL, found {masked(url)!r}"
    if not parts.netloc:
        return f"{masked(url)!r} names no host (redis) or bucket (s3)"
    if from_table and parts.password is not None:
        return "a password in pyproject.toml would be published with the project's source: set the URL with its password in HATCH_PRECOMPILE_REMOTE_CACHE instead (in CI, from a secret)"
    if parts.scheme == "s3" and (parts.username or parts.password):
        return "s3:// URLs hold no credentials: boto3 takes them as the AWS tools do (AWS_ACCESS_KEY_ID, ~/.aws, a role)"
    return None


class _Client(Protocol):
    def get(self, name: str) -> bytes | None: ...
    def put(self, name: str, data: bytes) -> None: ...
    def ping(self) -> None: ...


@dataclass
class Traffic:
    """What one model's artifacts moved through the store."""

    hits: int = 0
    misses: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0

    def add(self, other: Traffic) -> None:
        self.hits += other.hits
        self.misses += other.misses
        self.bytes_down += other.bytes_down
        self.bytes_up += other.bytes_up
        self.seconds += other.seconds

    def to_json(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "bytes_down": self.bytes_down, "bytes_up": self.bytes_up, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Traffic:
        return cls(int(data["hits"]), int(data["misses"]), int(data["bytes_down"]), int(data["bytes_up"]), float(data["seconds"]))

    def summary(self) -> str:
        megabytes = lambda count: f"{count / 1e6:.1f} MB"  # noqa: E731
        return f"{self.hits} hit(s), {self.misses} miss(es), {megabytes(self.bytes_down)} down, {megabytes(self.bytes_up)} up, {self.seconds:.2f} s"


@dataclass
class RemoteCache:
    """The store as one worker uses it: entries in and out, what moved, and
    what the build should be told (`take_notices`)."""

    settings: RemoteSettings
    traffic: Traffic = field(default_factory=Traffic)
    down: str | None = None  # why the store is unavailable, once it failed
    _client: _Client | None = None
    _notices: list[str] = field(default_factory=list)

    def fetch(self, key: str, model_dir: Path, local: EntryStore | None) -> ArtifactEntry | None:
        """The entry under `key` with its files copied into `model_dir`, by way of
        the local cache where there is one; None on a miss or when the store is down."""
        started = time.perf_counter()
        try:
            return self._fetch(key, model_dir, local)
        finally:
            self.traffic.seconds += time.perf_counter() - started  # the get, the unpacking and every sha256

    def _fetch(self, key: str, model_dir: Path, local: EntryStore | None) -> ArtifactEntry | None:
        blob = self._use(lambda client: client.get(_object_name(key)))
        if blob is None:
            self.traffic.misses += self.down is None
            return None
        self.traffic.bytes_down += len(blob)
        with tempfile.TemporaryDirectory(prefix="hatch-precompile-remote-") as scratch:
            store = local or EntryStore(Path(scratch))
            problem = store.adopt(key, blob)
            entry = None if problem else store.fetch(key, model_dir)
        if entry is None:
            self.traffic.misses += 1
            self._notices.append(f"remote cache {self.settings.address}: the entry {key[:12]} is damaged ({problem}); compiling it here")
            return None
        self.traffic.hits += 1
        return entry

    def store(self, key: str, model_dir: Path, entry: ArtifactEntry) -> None:
        """Put the entry of a freshly compiled artifact in the store (unless read-only or down)."""
        if self.settings.read_only or self.down is not None:
            return
        blob = pack_entry(key, model_dir, entry)
        started = time.perf_counter()
        self._use(lambda client: client.put(_object_name(key), blob))
        self.traffic.seconds += time.perf_counter() - started
        if self.down is None:
            self.traffic.bytes_up += len(blob)

    def take_traffic(self) -> Traffic:
        traffic, self.traffic = self.traffic, Traffic()
        return traffic

    def take_notices(self) -> list[str]:
        notices, self._notices = self._notices, []
        return notices

    def _use(self, operation: Any) -> Any:
        """`operation(client)`, or None once the store is down (saying why, once)."""
        if self.down is not None:
            return None
        try:
            if self._client is None:
                self._client = open_client(self.settings)
            return operation(self._client)
        except RemoteUnavailable as error:
            self.down = str(error)
            self._notices.append(unavailable_message(self.settings, self.down))
            return None


def unavailable_message(settings: RemoteSettings, why: str) -> str:
    return f"remote cache {settings.address} is unavailable ({why}); compiling locally, without it for the rest of this build"


@functools.cache
def remote_cache(settings: RemoteSettings) -> RemoteCache:
    """The worker's one RemoteCache per store: one connection, and "down" said once."""
    return RemoteCache(settings)


def pack_entry(key: str, model_dir: Path, entry: ArtifactEntry) -> bytes:
    """The entry as the store holds it: a tar of its files and entry.json,
    the same bytes for the same files (no times, owners or modes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        names = sorted(entry_files(entry))
        record = EntryStore.record(key, entry, {name: model_dir / name for name in names})
        for name, data in [(ENTRY_FILE, record), *((name, (model_dir / name).read_bytes()) for name in names)]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _object_name(key: str) -> str:
    return f"{KEY_PREFIX}{key[:2]}/{key}.tar"


def check_store(settings: RemoteSettings) -> str:
    """Reach the store and use it as a build would: write a probe object and read
    it back (read-only: read it only). What was done; RemoteUnavailable if not."""
    client = open_client(settings)
    client.ping()
    name = KEY_PREFIX + PROBE_KEY
    if settings.read_only:
        client.get(name)
        return f"reached {settings.address} and read from it (read-only: this build would write nothing)"
    probe = f"written by hatch-precompile check-cache at {time.time():.0f}".encode()
    client.put(name, probe)
    if client.get(name) != probe:
        raise RemoteUnavailable(f"wrote {name} and read back something else")
    return f"reached {settings.address}, wrote {name} and read it back"


def open_client(settings: RemoteSettings) -> _Client:
    """A connected client for the store; RemoteUnavailable when it cannot be had."""
    scheme = urlsplit(settings.url).scheme
    return _RedisClient(settings) if scheme in ("redis", "rediss") else _S3Client(settings)


class _RedisClient:
    """redis-py: one connection, bounded timeouts, no retries (a slow store is a down store)."""

    def __init__(self, settings: RemoteSettings) -> None:
        try:
            import redis
        except ImportError:
            raise RemoteUnavailable('it needs redis-py: add "hatch-precompile[redis]" to [build-system] requires') from None
        self._errors = (redis.RedisError,)
        self._settings = settings
        self._redis = redis.Redis.from_url(settings.url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=IO_TIMEOUT_S)

    def get(self, name: str) -> bytes | None:
        data: bytes | None = self._call(self._redis.get, name)
        return data

    def put(self, name: str, data: bytes) -> None:
        self._call(self._redis.set, name, data)

    def ping(self) -> None:
        self._call(self._redis.ping)

    def _call(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except self._errors as error:
            raise RemoteUnavailable(_reason(error, self._settings)) from None


class _S3Client:
    """boto3: the endpoint (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL), region and
    credentials as the AWS tools find them; bounded timeouts, one retry."""

    def __init__(self, settings: RemoteSettings) -> None:
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError:
            raise RemoteUnavailable('it needs boto3: add "hatch-precompile[s3]" to [build-system] requires') from None
        parts = urlsplit(settings.url)
        self._bucket, self._prefix = parts.netloc, parts.path.strip("/")
        self._errors = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
        self._settings = settings
        config = botocore.config.Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=IO_TIMEOUT_S, retries={"max_attempts": 2, "mode": "standard"})
        try:
            self._s3 = boto3.client("s3", config=config)
        except self._errors as error:
            raise RemoteUnavailable(_reason(error, self._settings)) from None

    def _key(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name

    def get(self, name: str) -> bytes | None:
        try:
            data: bytes = self._s3.get_object(Bucket=self._bucket, Key=self._key(name))["Body"].read()
            return data
        except self._errors as error:
            if getattr(error, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise RemoteUnavailable(_reason(error, self._settings)) from None

    def put(self, name: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self._bucket, Key=self._key(name), Body=data)
        except self._errors as error:
            raise RemoteUnavailable(_reason(error, self._settings)) from None

    def ping(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self._bucket)
        except self._errors as error:
            raise RemoteUnavailable(_reason(error, self._settings)) from None


def _reason(error: BaseException, settings: RemoteSettings) -> str:
    """The client's error in one line, with no password in it."""
    text = " ".join(str(error).split()) or "no message"
    password = urlsplit(settings.url).password
    if password:
        text = text.replace(password, "***")
    return f"{type(error).__name__}: {text}"[:300]
