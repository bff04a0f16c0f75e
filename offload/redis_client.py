"""A Redis tier's connection, from its URL: one server, or a Redis Cluster.

URL schemes (the part after the scheme is redis-py's, query options included)::

    redis://[user:pw@]host:port/db      one server (``redis.Redis``)
    rediss://...                        one server over TLS
    unix:///path/redis.sock?db=0        one server on a local socket
    redis+cluster://[user:pw@]host:port     a Redis Cluster (``redis.cluster.RedisCluster``):
    rediss+cluster://...                    the URL names one seed node, the client finds
                                            the others (``CLUSTER SLOTS``) and follows
                                            ``MOVED``/``ASK`` redirects; db 0 only

Every command a tier sends names keys of one hash slot (its keys share one hash tag),
so one node serves the whole tier and each Lua script runs on that node.

At construction the seed is asked once what it is (``CLUSTER SLOTS`` over a plain
connection), so a misconfiguration is an
:class:`~kvgov.exceptions.InvalidOffloadArgument` at start, not a tier that fails
later: a cluster node behind a one-server URL (it would answer ``MOVED`` for the
slots it does not own), a one-server Redis behind a cluster URL, a cluster the ACL
user may not discover (``+cluster|slots +command`` are needed), or refused
credentials. A seed that cannot be reached is not an error: Redis down at start is
Redis down, the tier is unavailable until it answers (the cluster client is built at
the first call that reaches it). Whatever fails later is a
:class:`~kvgov.exceptions.TierUnavailable`, with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from kvgov.exceptions import InvalidOffloadArgument, TierUnavailable
from kvgov.secrecy import redact_url

__all__ = ["CLUSTER_SCHEMES", "LuaScript", "RedisClient", "RedisConnection", "parse_redis_url"]

#: A tier URL's cluster scheme -> the scheme redis-py is given.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_SINGLE_SCHEMES = ("redis", "rediss", "unix")

#: A client of either kind: both take the same keyed commands.
RedisClient = redis.Redis | RedisCluster

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RedisURL:
    """A tier URL, checked: what redis-py is given, and whether it names a cluster.

    Attributes:
        url: the URL for redis-py (a cluster scheme turned into ``redis``/``rediss``).
        cluster: whether the URL selected Redis Cluster.
    """

    url: str
    cluster: bool


def parse_redis_url(url: object) -> RedisURL:
    """Check a tier URL and say whether it selects Redis Cluster (see the module docstring).

    Raises:
        InvalidOffloadArgument: not a redis://, rediss://, unix://, redis+cluster:// or
            rediss+cluster:// URL; a cluster URL with a socket path or a database other
            than 0.
    """
    schemes = "a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL"
    if not isinstance(url, str) or "://" not in url:
        raise InvalidOffloadArgument("url", redact_url(str(url)), f"must be {schemes}")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme in _SINGLE_SCHEMES:
        return RedisURL(url, cluster=False)
    if scheme not in CLUSTER_SCHEMES:
        raise InvalidOffloadArgument("url", redact_url(url), f"must be {schemes}")
    plain = f"{CLUSTER_SCHEMES[scheme]}://{rest}"
    db = urlsplit(plain).path.strip("/")
    if db not in ("", "0"):
        raise InvalidOffloadArgument(
            "url", redact_url(url), "Redis Cluster has database 0 only (end the URL in /0)"
        )
    return RedisURL(plain, cluster=True)


class _Seed(Enum):
    """What the seed node said it is."""

    CLUSTER = "cluster"
    SINGLE = "single"
    UNKNOWN = "unknown"  # it refused CLUSTER SLOTS for another reason (an ACL, a proxy)
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A Lua script run with ``EVALSHA`` (loaded on a ``NOSCRIPT``), on one slot's node.

    Attributes:
        source: the script.
        sha: its SHA-1, as Redis names it.
    """

    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> LuaScript:
        """The script with its SHA-1."""
        return cls(source, hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest())

    def run(self, client: RedisClient, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run it on ``keys`` (all of one slot: a cluster client sends it to that slot's node).

        Raises:
            redis.RedisError: as the client raised it.
        """
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)  # a cluster client loads it on every primary
            return client.evalsha(self.sha, len(keys), *keys, *args)


class RedisConnection:
    """One tier's client: a ``redis.Redis`` or a ``RedisCluster``, chosen by the URL scheme.

    Thread-safe (redis-py pools). A cluster client is shared by the connections of this
    process to the same URL with the same timeout (see :class:`_SharedClusterClients`).

    Args:
        url: the tier URL (see the module docstring).
        tier: the tier's name (for errors).
        timeout: seconds to connect and to wait for each reply.

    Raises:
        InvalidOffloadArgument: a bad URL, or a reachable seed that does not match it.
    """

    def __init__(self, url: str, *, tier: str, timeout: float) -> None:
        parsed = parse_redis_url(url)
        self._url = parsed.url
        self._shown = redact_url(url)
        self.cluster = parsed.cluster
        self._tier = tier
        self._timeout = timeout
        self._lock = threading.Lock()
        self._client: RedisClient | None = None
        if not self.cluster:  # building a one-server client does no I/O
            self._client = redis.Redis.from_url(
                self._url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 1),
            )
        seed = self._probe()
        problem = self._mismatch(seed)
        if problem is not None:
            self.close()
            raise InvalidOffloadArgument("url", self._shown, problem)
        if self.cluster and seed is _Seed.CLUSTER:
            with contextlib.suppress(TierUnavailable):  # if not now, at the first call
                self.client()

    def __repr__(self) -> str:
        return f"RedisConnection({self._shown!r}, cluster={self.cluster})"

    def _probe(self) -> _Seed:
        """Ask the seed node once whether it is a cluster node."""
        seed = redis.Redis.from_url(
            self._url,
            socket_timeout=self._timeout,
            socket_connect_timeout=self._timeout,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            seed.cluster("slots")
            return _Seed.CLUSTER
        except redis.exceptions.AuthenticationError:
            raise InvalidOffloadArgument(
                "url", self._shown, "Redis refused the credentials (user and password)"
            ) from None
        except redis.exceptions.NoPermissionError:
            if self.cluster:
                raise InvalidOffloadArgument(
                    "url",
                    self._shown,
                    "the ACL user may not run CLUSTER SLOTS: a cluster client needs "
                    "+cluster|slots and +command to find the nodes",
                ) from None
            return _Seed.UNKNOWN
        except redis.exceptions.ResponseError as exc:
            if "cluster support disabled" in str(exc).lower():
                return _Seed.SINGLE
            return _Seed.UNKNOWN
        except redis.RedisError:
            return _Seed.UNREACHABLE
        finally:
            seed.close()

    def _mismatch(self, seed: _Seed) -> str | None:
        if self.cluster and seed in (_Seed.SINGLE, _Seed.UNKNOWN):
            return (
                "the server is not a Redis Cluster node (it refused CLUSTER SLOTS): "
                "use redis:// or rediss:// for one server"
            )
        if not self.cluster and seed is _Seed.CLUSTER:
            return (
                "the server is a Redis Cluster node, which answers MOVED for the slots it "
                "does not own: use redis+cluster:// or rediss+cluster://"
            )
        return None

    def client(self) -> RedisClient:
        """The client, building the cluster client on first use.

        Raises:
            TierUnavailable: the cluster could not be discovered (no node reachable, or
                no node says it is a cluster node).
        """
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                self._client = _SHARED.acquire(self._url, self._timeout, self._tier, self._shown)
            return self._client

    def run(self, what: str, fn: Callable[[RedisClient], T]) -> T:
        """``fn(client)``, with every failure to reach Redis a ``TierUnavailable``.

        Raises:
            TierUnavailable: Redis cannot be reached, refused the command, or (a
                one-server URL) a cluster node redirected it.
        """
        client = self.client()
        try:
            return fn(client)
        except redis.exceptions.AskError as exc:  # MOVED too (a subclass)
            if self.cluster:  # the cluster client follows redirects: this is one too many
                raise TierUnavailable(self._tier, f"{what}: {type(exc).__name__}: {exc}") from None
            raise TierUnavailable(
                self._tier,
                f"{what}: a Redis Cluster node redirected the command ({exc}): "
                f"{self._shown} must use redis+cluster:// or rediss+cluster://",
            ) from None
        except (redis.RedisError, RedisClusterException) as exc:
            raise TierUnavailable(self._tier, f"{what}: {type(exc).__name__}: {exc}") from None

    def pipeline(
        self,
        what: str,
        key: str,
        fill: Callable[[redis.client.Pipeline], None],
        *,
        transaction: bool,
    ) -> list[Any]:
        """One pipeline (a ``MULTI``/``EXEC`` if ``transaction``) of commands on ``key``'s slot.

        ``fill`` queues the commands; every one must name keys of ``key``'s slot. On a
        cluster the pipeline goes to the node that owns the slot, over that node's own
        connection (redis-py's cluster pipelines refuse ``EVALSHA``); a ``MOVED`` (the slot
        moved since the client last read the slot map) refreshes the map and runs it once
        more. Errors of single commands come back in the list (``raise_on_error=False``).

        Raises:
            TierUnavailable: Redis cannot be reached, or the slot moved again.
        """

        def go(client: RedisClient) -> list[Any]:
            for attempt in (0, 1):
                if isinstance(client, RedisCluster):
                    owner = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
                    node: redis.Redis = client.get_redis_connection(owner)
                else:
                    node = client
                pipe = node.pipeline(transaction=transaction)
                fill(pipe)
                try:
                    results = list(pipe.execute(raise_on_error=False))
                except redis.exceptions.AskError:  # MOVED too: in a MULTI, EXEC is aborted
                    if attempt or not isinstance(client, RedisCluster):
                        raise
                    client.nodes_manager.initialize()
                    continue
                moved = [r for r in results if isinstance(r, redis.exceptions.AskError)]
                if not moved:
                    return results
                if attempt or not isinstance(client, RedisCluster):
                    raise moved[0]  # run() says what a redirect means for this URL
                client.nodes_manager.initialize()
            raise AssertionError("unreachable")  # pragma: no cover

        return self.run(what, go)

    def close(self) -> None:
        """Close the client's connections (a one-server client reconnects if used again)."""
        with self._lock:
            client, self._client = self._client, (None if self.cluster else self._client)
            if isinstance(client, RedisCluster):
                _SHARED.release(self._url, self._timeout)
            elif client is not None:
                client.close()


class _SharedClusterClients:
    """One ``RedisCluster`` per URL and timeout in a process, shared by the tiers using it.

    Building one asks a node for the slot map and for the command table (``COMMAND``:
    some 100 ms of parsing); a process that opens several tiers on one cluster (a
    connector's scheduler and worker sides in one process, tests) builds it once. The
    client is thread-safe; it is closed when the last tier using it closes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, float], tuple[RedisCluster, int]] = {}

    def acquire(self, url: str, timeout: float, tier: str, shown: str) -> RedisCluster:
        with self._lock:
            entry = self._clients.get((url, timeout))
            if entry is not None:
                self._clients[(url, timeout)] = (entry[0], entry[1] + 1)
                return entry[0]
            try:
                client = RedisCluster.from_url(
                    url,
                    socket_timeout=timeout,
                    socket_connect_timeout=timeout,
                    retry=Retry(NoBackoff(), 1),
                    require_full_coverage=False,  # the tier needs its own slot only
                )
            except (redis.RedisError, RedisClusterException) as exc:
                raise TierUnavailable(tier, f"Redis Cluster at {shown}: {exc}") from None
            self._clients[(url, timeout)] = (client, 1)
            return client

    def release(self, url: str, timeout: float) -> None:
        with self._lock:
            entry = self._clients.pop((url, timeout), None)
            if entry is None:
                return
            if entry[1] > 1:
                self._clients[(url, timeout)] = (entry[0], entry[1] - 1)
            else:
                entry[0].close()


_SHARED = _SharedClusterClients()
