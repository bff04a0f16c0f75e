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

from kvgov.defaults import REDIS_TIMEOUT_SECONDS
from kvgov.offload.redis_client import RedisConnection

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


# --------------------------------------------------------------------------- Redis Cluster

#: Scheme a tier URL uses to select the Redis Cluster client (kvgov.offload.redis_client).
CLUSTER_SCHEME = "redis+cluster"


class OwnRedisCluster:
    """Three ``redis-server`` masters in cluster mode on free ports (no replicas, no persistence).

    Started once per test session (about a second); tests share it under unique key
    prefixes, as they share the single server.
    """

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        ports: list[int] = []
        while len(ports) < 2 * nodes:  # distinct, though each was free on its own
            if (port := _free_port()) not in ports:
                ports.append(port)
        self.ports = ports[:nodes]
        # the bus port must be given: the default (port + 10000) may be over 65535
        self.bus_ports = ports[nodes:]
        self._workdir = workdir
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The tier URL: one seed node; the client discovers the others."""
        return f"{CLUSTER_SCHEME}://127.0.0.1:{self.ports[0]}/0"

    def node_urls(self) -> list[str]:
        """A plain ``redis://`` URL per node (to talk to one node directly)."""
        return [f"redis://127.0.0.1:{p}/0" for p in self.ports]

    def start(self) -> None:
        for port, bus in zip(self.ports, self.bus_ports, strict=True):
            self._procs.append(
                subprocess.Popen(
                    ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                     "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                     "--cluster-port", str(bus),
                     "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                     "--daemonize", "no", "--dir", str(self._workdir),
                     "--logfile", f"redis-{port}.log"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        deadline = time.monotonic() + 10
        for url in self.node_urls():
            while _redis_reason(url) is not None:
                if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                    raise RuntimeError(
                        f"redis-server cluster nodes {self.ports} did not start: "
                        f"see the logs in {self._workdir}"
                    )
                time.sleep(0.02)
        if len(self.ports) == 1:  # redis-cli --cluster create wants three masters
            node = redis.Redis(port=self.ports[0])
            node.cluster("addslotsrange", 0, 16383)
            node.close()
        else:
            subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip
        for url in self.node_urls():
            client = redis.Redis.from_url(url, socket_timeout=1)
            try:
                while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    if time.monotonic() > deadline + 20:
                        raise RuntimeError(f"the cluster on {self.ports} never reached state ok")
                    time.sleep(0.05)
            finally:
                client.close()

    def client(self) -> redis.RedisCluster:
        """A cluster client (for tests that read or write keys as an operator would)."""
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0])

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under ``prefix`` on every node (each node scanned on its own)."""
        for url in self.node_urls():
            node = redis.Redis.from_url(url)
            try:
                for key in node.scan_iter(match=f"{prefix}:*", count=1000):
                    node.delete(key)  # one key at a time: a node holds several slots
            finally:
                node.close()

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self._procs = []


def _cluster_binaries_reason() -> str | None:
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    return f"{' and '.join(missing)} not installed: no local Redis Cluster" if missing else None


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedisCluster]:
    """A private three-node Redis Cluster for the whole session, killed at the end."""
    reason = _cluster_binaries_reason()
    if reason is not None:  # printed by -ra
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI has them: this must not be skipped)")
        pytest.skip(reason)
    cluster = OwnRedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        # Held for the session: tiers on this URL share its cluster client (built once,
        # as in any process with several tiers on one cluster: kvgov.offload.redis_client).
        warm = RedisConnection(cluster.url, tier="warm", timeout=REDIS_TIMEOUT_SECONDS)
        yield cluster
        warm.close()
    finally:
        cluster.stop()


@pytest.fixture()
def redis_cluster_prefix(redis_cluster: OwnRedisCluster) -> Iterator[str]:
    """A unique key prefix on the session's cluster; its keys are deleted afterwards."""
    prefix = f"kvgov-test:{uuid.uuid4().hex}"
    yield prefix
    redis_cluster.delete_prefix(prefix)


class RedisTarget:
    """Where a test's Redis tier lives: the shared single server or the private cluster.

    Attributes:
        kind: ``"single"`` or ``"cluster"``.
        url: the tier URL (``redis://`` or ``redis+cluster://``).
        prefix: the test's unique key prefix (its keys are deleted afterwards).
    """

    def __init__(self, kind: str, url: str, prefix: str) -> None:
        self.kind, self.url, self.prefix = kind, url, prefix

    def client(self) -> redis.Redis | redis.RedisCluster:
        """A raw client of the same deployment (an operator's, an attacker's access)."""
        if self.kind == "cluster":
            return redis.RedisCluster.from_url(self.url.replace(f"{CLUSTER_SCHEME}://", "redis://"))
        return redis.Redis.from_url(self.url)


@pytest.fixture(params=["single", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    """Each Redis deployment in turn: the shared server, then a three-node cluster."""
    if request.param == "cluster":
        cluster: OwnRedisCluster = request.getfixturevalue("redis_cluster")
        return RedisTarget("cluster", cluster.url, request.getfixturevalue("redis_cluster_prefix"))
    return RedisTarget("single", SHARED_REDIS, request.getfixturevalue("redis_prefix"))
