"""Real servers on loopback for the remote build cache: Redis (Debian's
redis-server) and an S3-compatible one (moto's server mode). Used by
tests/test_remote_cache.py and benchmarks/build_time.py."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str  # what HATCH_PRECOMPILE_REMOTE_CACHE names
    env: dict[str, str]  # what a build needs besides the URL (S3: the endpoint and credentials)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"no server on port {port} after 30 s")


def start_redis(tmp_path: Path, *args: str) -> Server:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed: `apt-get install redis-server` (./dev.sh test installs it where it runs as root)"
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path), *args]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(port, process)
    return Server(process, f"redis://127.0.0.1:{port}/0", {})


def start_s3(tmp_path: Path) -> Server:
    """moto's server mode: an S3 endpoint on loopback, with one bucket made by boto3."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(port, process)
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    server = Server(process, "s3://wheels/team-cache", env)
    s3_client(server).create_bucket(Bucket="wheels")
    return server


def s3_client(server: Server) -> Any:
    import boto3

    env = server.env
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
