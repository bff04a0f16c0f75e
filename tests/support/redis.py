"""Redis for tests: the shared server under a unique key prefix, or a private one.

The shared server at 127.0.0.1:6379 (``KVGOV_TEST_REDIS_URL``) is used only under a
unique key prefix per test, and every key under it is deleted afterwards (never
FLUSHDB); where it is down, its tests skip with the reason printed, except under
``CI=true``. Tests that kill Redis start their own ``redis-server`` on a free port and
kill only that one. The fixtures here are re-exported by the conftest of each test
package that uses them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

SHARED_REDIS = os.environ.get("KVGOV_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_reason(url: str) -> str | None:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
        return None
    except redis.RedisError as exc:
        return f"Redis not reachable at {url}: {exc}"


@pytest.fixture()
def redis_prefix() -> Iterator[str]:
    """A unique key prefix on the shared Redis; every key under it is deleted afterwards."""
    reason = _redis_reason(SHARED_REDIS)
    if reason is not None:  # printed by -ra
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI has Redis: this must not be skipped)")
        pytest.skip(reason)
    prefix = f"kvgov-test:{uuid.uuid4().hex}"
    yield prefix
    client = redis.Redis.from_url(SHARED_REDIS)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """A redis-server this test started (no persistence), which it may kill and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while _redis_reason(self.url) is not None:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A private redis-server on a free port, killed at the end."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (CI has it: this must not be skipped)")
        pytest.skip("redis-server is not installed")
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.kill()
