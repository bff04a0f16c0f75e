"""The shared Redis tier: sealed blocks a fleet of workers reads, LRU within a byte capacity.

Keys, for a tier named N under prefix P (default ``kvgov:offload``); the braces make
all of a tier's keys one Redis Cluster hash slot, so the Lua scripts stay atomic and run
on the one node that owns the slot (neither P nor N may hold a brace, which would move
the hash tag)::

    P:{N}:o:<block key hex>   the encoded object (kvgov.offload.objects), PX = time to deadline
    P:{N}:m                   hash  block key hex -> "nbytes|deadline_us|tenant hex|scope hex"
    P:{N}:lru                 zset  block key hex, scored by a shared access tick
    P:{N}:dl                  zset  block key hex, scored by deadline_us
    P:{N}:t:<tenant hex>      set   the tenant's block key hexes
    P:{N}:bytes               int   sum of nbytes over the hash
    P:{N}:tick                int   the access tick (shared, so LRU spans all workers)

Every write is atomic, so concurrent workers never see or leave half an update: a put
is one MULTI/EXEC of a Lua script (drop the old copy, evict, enter the index) and a plain
``SET`` of the object (the object's bytes never pass through Lua, which cost a put about
twice a plain SET); delete and delete by tenant are one Lua script each. A get is one
pipelined round trip: ``GET`` and a script that touches the object (or drops its index
entries if it is gone). Every command names keys of the tier's slot only (no multi-slot
command, no scan across nodes), so the tier runs on one server or on Redis Cluster alike
(:mod:`kvgov.offload.redis_client` picks the client from the URL). Redis
expires an object itself at its deadline; its index entries are removed by the next
``get``, eviction or ``list_expired`` sweep that meets them.

A Redis operator sees the object keys (block keys are HMACs: they reveal no tokens),
scope digests, tenant names, sizes, deadlines and access times; never KV content
(see docs/offload.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from redis.client import Pipeline
from redis.exceptions import NoScriptError

from kvgov.defaults import REDIS_KEY_PREFIX, REDIS_TIMEOUT_SECONDS
from kvgov.exceptions import InvalidOffloadArgument, TierUnavailable

from .objects import ObjectInfo, SealedBlock, decode, encode
from .redis_client import LuaScript, RedisClient, RedisConnection
from .tier import TierUsage, check_capacity, check_tier_name

__all__ = ["RedisTier"]

# Lua shared by the scripts: drop(P, m) removes member m everywhere and returns its size.
_DROP = """
local function drop(P, m)
  redis.call('DEL', P .. ':o:' .. m)
  redis.call('ZREM', P .. ':lru', m)
  redis.call('ZREM', P .. ':dl', m)
  local meta = redis.call('HGET', P .. ':m', m)
  if not meta then return false end
  redis.call('HDEL', P .. ':m', m)
  local size, _dl, tenant = string.match(meta, '^(%d+)|(%-?%d+)|(%x+)|')
  redis.call('SREM', P .. ':t:' .. tenant, m)
  redis.call('DECRBY', P .. ':bytes', tonumber(size))
  return meta
end
"""

# KEYS[1]=P  ARGV: member, meta, nbytes, capacity, deadline_us, tenant_hex
# The index half of a put: the object itself is written by a plain SET in the same
# MULTI/EXEC (the blob does not travel through Lua, which copied it twice: the put cost
# ~2x a plain SET of the same bytes). MULTI/EXEC keeps the pair atomic.
_PUT_INDEX = (
    _DROP
    + """
local P = KEYS[1]
local m, size, cap = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
drop(P, m)
local used = tonumber(redis.call('GET', P .. ':bytes') or '0')
local evicted = {}
while used + size > cap do
  local victim = redis.call('ZRANGE', P .. ':lru', 0, 0)[1]
  if not victim then break end
  local meta = drop(P, victim)
  if meta then
    used = used - tonumber(string.match(meta, '^(%d+)'))
    table.insert(evicted, meta .. '|' .. victim)
  end
end
redis.call('ZADD', P .. ':lru', redis.call('INCR', P .. ':tick'), m)
redis.call('ZADD', P .. ':dl', ARGV[5], m)
redis.call('HSET', P .. ':m', m, ARGV[2])
redis.call('SADD', P .. ':t:' .. ARGV[6], m)
redis.call('INCRBY', P .. ':bytes', size)
return evicted
"""
)

# KEYS[1]=P  ARGV: member. The touch half of a get (the GET itself is pipelined beside
# it): most recently used if the object is there, its index entries dropped if not.
_TOUCH = (
    _DROP
    + """
local P, m = KEYS[1], ARGV[1]
if redis.call('EXISTS', P .. ':o:' .. m) == 0 then
  drop(P, m)
  return 0
end
redis.call('ZADD', P .. ':lru', 'XX', redis.call('INCR', P .. ':tick'), m)
return 1
"""
)

# KEYS[1]=P  ARGV: member
_DELETE = _DROP + "\nreturn drop(KEYS[1], ARGV[1])\n"

# KEYS[1]=P  ARGV: tenant_hex
_DELETE_TENANT = (
    _DROP
    + """
local P = KEYS[1]
local out = {}
for _, m in ipairs(redis.call('SMEMBERS', P .. ':t:' .. ARGV[1])) do
  local meta = drop(P, m)
  if meta then table.insert(out, meta .. '|' .. m) end
end
redis.call('DEL', P .. ':t:' .. ARGV[1])
return out
"""
)


def _info(meta: bytes, member: bytes) -> ObjectInfo:
    size, deadline, tenant, scope = meta.decode("ascii").split("|")
    return ObjectInfo(
        block_key=bytes.fromhex(member.decode("ascii")),
        scope_digest=bytes.fromhex(scope),
        tenant=bytes.fromhex(tenant).decode("utf-8"),
        deadline_us=int(deadline),
        nbytes=int(size),
    )


def _info_with_member(entry: bytes) -> ObjectInfo:
    meta, _sep, member = entry.rpartition(b"|")
    return _info(meta, member)


class RedisTier:
    """Sealed blocks in a Redis server shared by several workers. Thread-safe (redis-py pools).

    Failures to reach Redis raise :class:`~kvgov.exceptions.TierUnavailable`; the store
    then skips the tier for a while. Nothing here retries beyond one reconnect.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` or ``unix://...``
            for one server; ``redis+cluster://[user:password@]host:port`` or
            ``rediss+cluster://...`` for a Redis Cluster (one seed node).
        capacity_bytes: most bytes the tier holds, for all workers together.
        name: the tier's name, bound into every object's AAD: every worker sharing the
            tier must use the same name (and prefix).
        prefix: the key prefix (one per deployment; tests use a unique one).
        timeout: seconds to connect and to wait for each reply.

    Raises:
        InvalidOffloadArgument: a bad URL, capacity, name or prefix (a brace in either),
            or a reachable server that does not match the URL (a cluster node behind a
            one-server URL, or the other way round; see :mod:`~kvgov.offload.redis_client`).
    """

    #: ``put`` sends the object's bytes and keeps nothing of it (see ``Tier``).
    put_copies = True

    def __init__(
        self,
        url: str,
        capacity_bytes: int,
        *,
        name: str = "redis",
        prefix: str = REDIS_KEY_PREFIX,
        timeout: float = REDIS_TIMEOUT_SECONDS,
    ) -> None:
        self._name = check_tier_name(name)
        self._capacity = check_capacity(capacity_bytes)
        for what, value in (("name", name), ("prefix", prefix)):
            if not isinstance(value, str) or "{" in value or "}" in value:
                raise InvalidOffloadArgument(
                    what, value, "no braces: the tier's own {name} is its Redis Cluster hash tag"
                )
        self._prefix = f"{prefix}:{{{name}}}"
        self._redis = RedisConnection(url, tier=self._name, timeout=timeout)
        self._put_index = LuaScript.of(_PUT_INDEX)
        self._touch = LuaScript.of(_TOUCH)
        self._delete = LuaScript.of(_DELETE)
        self._delete_tenant = LuaScript.of(_DELETE_TENANT)

    def __repr__(self) -> str:
        return f"RedisTier(name={self._name!r}, prefix={self._prefix!r})"

    @property
    def name(self) -> str:
        """The tier's name."""
        return self._name

    @property
    def capacity_bytes(self) -> int:
        """Most bytes the tier holds (all workers)."""
        return self._capacity

    @property
    def prefix(self) -> str:
        """The prefix of every key this tier writes (``<prefix>:{<name>}``)."""
        return self._prefix

    def object_key(self, block_key: bytes) -> str:
        """The Redis key holding the object for ``block_key``."""
        return f"{self._prefix}:o:{block_key.hex()}"

    def _call(self, what: str, fn: Callable[[RedisClient], Any]) -> Any:
        return self._redis.run(what, fn)

    def _script(self, what: str, script: LuaScript, args: list[Any]) -> Any:
        return self._call(what, lambda c: script.run(c, [self._prefix], args))

    def put(self, obj: SealedBlock, now_us: int) -> list[ObjectInfo]:
        """Store ``obj`` with a TTL to its deadline, evicting LRU objects (of any worker).

        Raises:
            InvalidOffloadArgument: the object is larger than the whole capacity.
            TierUnavailable: Redis cannot be reached or refused the write.
        """
        info = obj.info()
        if info.nbytes > self._capacity:
            raise InvalidOffloadArgument(
                "obj",
                f"<{info.nbytes} bytes>",
                f"larger than tier {self._name!r}'s capacity of {self._capacity} bytes",
            )
        tenant_hex = obj.tenant.encode("utf-8").hex()
        meta = f"{info.nbytes}|{obj.deadline_us}|{tenant_hex}|{obj.scope_digest.hex()}"
        ttl_ms = max(1, math.ceil((obj.deadline_us - now_us) / 1000))
        member = obj.block_key.hex()
        index: list[str | int] = [
            member, meta, info.nbytes, self._capacity, obj.deadline_us, tenant_hex
        ]  # fmt: skip
        blob = encode(obj)
        key = self.object_key(obj.block_key)

        def write(pipe: Pipeline) -> None:
            # one round trip, atomic (keys of one slot: one node runs it all): the index
            # (drop, evict, enter) and then the object
            pipe.evalsha(self._put_index.sha, 1, self._prefix, *index)
            pipe.set(key, blob, px=ttl_ms)

        results = self._redis.pipeline("put", self._prefix, write, transaction=True)
        if isinstance(results[0], NoScriptError):
            # Redis lost its scripts (a restart, SCRIPT FLUSH): the SET ran without its
            # index; load the script and put again (the index script drops that object)
            self._call("put", lambda client: client.script_load(_PUT_INDEX))
            results = self._redis.pipeline("put", self._prefix, write, transaction=True)
        for result in results:
            if isinstance(result, Exception):  # half a put: drop the object and its index
                self._script("put", self._delete, [member])
                raise TierUnavailable(self._name, f"put: {type(result).__name__}: {result}")
        return [_info_with_member(e) for e in results[0]]

    def get(self, block_key: bytes) -> SealedBlock | None:
        """The object for ``block_key`` (touched as most recently used), or None.

        Raises:
            ObjectCorrupt: the stored value does not parse.
            TierUnavailable: Redis cannot be reached.
        """
        member = block_key.hex()
        key = self.object_key(block_key)

        def read(pipe: Pipeline) -> None:
            # one round trip: the object and its touch (or its stale index dropped)
            pipe.get(key)
            pipe.evalsha(self._touch.sha, 1, self._prefix, member)

        blob, touched = self._redis.pipeline("get", self._prefix, read, transaction=False)
        if isinstance(touched, NoScriptError):
            self._script("get", self._touch, [member])
        elif isinstance(touched, Exception):
            raise TierUnavailable(self._name, f"get: {type(touched).__name__}: {touched}")
        if isinstance(blob, Exception):
            raise TierUnavailable(self._name, f"get: {type(blob).__name__}: {blob}")
        if blob is None:
            return None
        return decode(blob, tier=self._name, block_key=block_key)

    def exists(self, block_keys: list[bytes]) -> list[bool]:
        """Whether an object is stored under each key (one pipelined round trip, no touch).

        Raises:
            TierUnavailable: Redis cannot be reached.
        """

        def read(client: RedisClient) -> list[Any]:
            pipe = client.pipeline(transaction=False)  # one slot: one node, one round trip
            for key in block_keys:
                pipe.exists(self.object_key(key))
            return pipe.execute()

        if not block_keys:
            return []
        return [bool(n) for n in self._call("exists", read)]

    def delete(self, block_key: bytes) -> ObjectInfo | None:
        """Delete the object for ``block_key``; returns its info, or None."""
        member = block_key.hex()
        meta = self._script("delete", self._delete, [member])
        return None if meta is None else _info(meta, member.encode("ascii"))

    def delete_by_tenant(self, tenant: str) -> list[ObjectInfo]:
        """Delete every object of ``tenant`` (one atomic script)."""
        tenant_hex = tenant.encode("utf-8").hex()
        out = self._script("delete_by_tenant", self._delete_tenant, [tenant_hex])
        return [_info_with_member(e) for e in out]

    def _all_infos(self) -> list[ObjectInfo]:
        items = self._call("scan", lambda c: list(c.hscan_iter(f"{self._prefix}:m")))
        return [_info(meta, member) for member, meta in items]

    def delete_where(self, predicate: Callable[[ObjectInfo], bool]) -> list[ObjectInfo]:
        """Delete every object whose info satisfies ``predicate`` (scans the index)."""
        return [
            deleted
            for info in self._all_infos()
            if predicate(info) and (deleted := self.delete(info.block_key)) is not None
        ]

    def list_expired(self, now_us: int) -> list[ObjectInfo]:
        """Objects whose deadline is at or before ``now_us`` (Redis may have expired them)."""
        members = self._call(
            "list_expired",
            lambda c: c.zrangebyscore(f"{self._prefix}:dl", "-inf", now_us),
        )
        if not members:
            return []
        metas = self._call("list_expired", lambda c: c.hmget(f"{self._prefix}:m", members))
        return [_info(meta, m) for m, meta in zip(members, metas, strict=True) if meta is not None]

    def usage(self) -> TierUsage:
        """Bytes and objects held, by every worker."""

        def read(client: RedisClient) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.get(f"{self._prefix}:bytes")
            pipe.hlen(f"{self._prefix}:m")
            return pipe.execute()

        used, blocks = self._call("usage", read)
        return TierUsage(int(used or 0), int(blocks))

    def close(self) -> None:
        """Close this worker's connections; the shared objects stay for the others."""
        self._redis.close()
