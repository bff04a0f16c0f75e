"""The Redis tier on a real Redis Cluster: URL, misconfiguration at start, slots, ACL, resharding.

The cluster is the session's private one (three masters on free ports, see
tests/support/redis.py); the tier's cases shared with the single server run in
test_tiers.py, test_tamper.py, test_isolation.py, test_shred.py and test_workers.py
(tier kind ``redis-cluster``). Here: what only a cluster has.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import key_slot

from kvgov.exceptions import InvalidOffloadArgument, TierUnavailable
from kvgov.offload import RedisTier, SealedBlock, Tier
from kvgov.offload.redis_client import parse_redis_url
from tests.support.redis import OwnRedis, OwnRedisCluster

NOW_US = 1_700_000_000_000_000


def obj(i: int, *, tenant: str = "acme", deadline_us: int = NOW_US + 60_000_000) -> SealedBlock:
    """A sealed-looking block number ``i`` (tiers never decrypt)."""
    return SealedBlock(
        block_key=i.to_bytes(32, "big"),
        scope_digest=b"S" * 32,
        tenant=tenant,
        deadline_us=deadline_us,
        written_us=NOW_US,
        key_id=b"i" * 16,
        salt=b"s" * 16,
        nonce=b"n" * 12,
        ciphertext=bytes([i % 256]) * 100,
    )


def _key(i: int) -> bytes:
    return i.to_bytes(32, "big")


def _owner(cluster: OwnRedisCluster, slot: int) -> int:
    """The port of the node that owns ``slot`` (asked of the cluster, not computed)."""
    client = redis.Redis(port=cluster.ports[0])
    try:
        for start, end, primary, *_ in client.cluster("slots"):
            if int(start) <= slot <= int(end):
                return int(primary[1])
    finally:
        client.close()
    raise AssertionError(f"slot {slot} is not covered")


def _names_on_every_node(cluster: OwnRedisCluster, salt: str) -> dict[int, str]:
    """One tier name per node: the node that owns the name's hash tag -> the name."""
    by_port: dict[int, str] = {}
    for i in range(200):
        name = f"t{salt}{i}"
        by_port.setdefault(_owner(cluster, key_slot(f"{{{name}}}".encode())), name)
        if len(by_port) == len(cluster.ports):
            return by_port
    raise AssertionError("no tier name found for some node")  # pragma: no cover


def test_cluster_urls_are_parsed() -> None:
    """redis+cluster:// and rediss+cluster:// select the cluster client; db 0 only."""
    assert parse_redis_url("redis://h:1/2").cluster is False
    assert parse_redis_url("unix:///run/redis.sock").cluster is False
    parsed = parse_redis_url("rediss+cluster://u:pw@h:6380/0?ssl_cert_reqs=required")
    assert parsed.cluster and parsed.url == "rediss://u:pw@h:6380/0?ssl_cert_reqs=required"
    assert parse_redis_url("redis+cluster://h:1").url == "redis://h:1"
    with pytest.raises(InvalidOffloadArgument, match="database 0 only"):
        parse_redis_url("redis+cluster://h:1/3")
    for bad in ("http://h:1", "unix+cluster:///s.sock", "h:6379", 6379):
        with pytest.raises(InvalidOffloadArgument, match="redis\\+cluster://"):
            parse_redis_url(bad)


@pytest.mark.parametrize(("field", "value"), [("name", "a{b}"), ("prefix", "kvgov:{x}")])
def test_braces_in_a_name_or_prefix_are_refused(field: str, value: str) -> None:
    """A brace would move the hash tag and scatter the tier's keys over slots."""
    with pytest.raises(InvalidOffloadArgument, match="no braces"):
        RedisTier("redis://127.0.0.1:1/0", 1024, **{field: value})  # type: ignore[arg-type]


def test_tiers_on_every_node_each_work_and_keep_their_keys_on_one_node(
    redis_cluster: OwnRedisCluster,
    redis_cluster_prefix: str,
    make_tier: Callable[..., Tier],
) -> None:
    """Tiers whose names hash to each of the three nodes all work, every command of
    theirs included; each tier's keys are all on the node that owns its slot."""
    by_port = _names_on_every_node(redis_cluster, uuid.uuid4().hex[:6])
    assert sorted(by_port) == sorted(redis_cluster.ports)  # the tiers span every node
    tiers = {port: make_tier("redis-cluster", capacity=2 * obj(0).nbytes, name=name)
             for port, name in by_port.items()}  # fmt: skip
    for tier in tiers.values():
        assert isinstance(tier, RedisTier)
        tier.put(obj(1, deadline_us=NOW_US + 10), NOW_US)
        tier.put(obj(2, tenant="beta"), NOW_US)
        assert [i.block_key for i in tier.put(obj(3), NOW_US)] == [_key(1)]  # LRU eviction
        assert tier.exists([_key(2), _key(1), _key(3)]) == [True, False, True]
        got = tier.get(_key(3))
        assert got is not None and bytes(got.ciphertext) == bytes(obj(3).ciphertext)
        assert [i.block_key for i in tier.list_expired(NOW_US + 60_000_000)] == [_key(2), _key(3)]
        assert [i.block_key for i in tier.delete_by_tenant("beta")] == [_key(2)]
        assert [i.block_key for i in tier.delete_where(lambda i: True)] == [_key(3)]
        tier.put(obj(4), NOW_US)
        assert (tier.usage().stored_blocks, tier.usage().stored_bytes) == (1, obj(4).nbytes)
    for port, tier in tiers.items():
        assert isinstance(tier, RedisTier)
        for node_port in redis_cluster.ports:
            node = redis.Redis(port=node_port)
            keys = list(node.scan_iter(match=f"{tier.prefix}:*"))
            node.close()
            if node_port == port:
                assert tier.object_key(_key(4)).encode() in keys and len(keys) >= 5
            else:
                assert keys == [], f"tier {tier.name} has keys on {node_port}"


def test_a_cluster_node_behind_a_one_server_url_is_refused_at_start(
    redis_cluster: OwnRedisCluster,
) -> None:
    """A plain client would get MOVED for the slots the node does not own: refused, typed."""
    for url in redis_cluster.node_urls():
        with pytest.raises(InvalidOffloadArgument, match="redis\\+cluster://"):
            RedisTier(url, 1024, name=uuid.uuid4().hex[:8])


def test_a_one_server_redis_behind_a_cluster_url_is_refused_at_start(own_redis: OwnRedis) -> None:
    """A server that is no cluster node cannot be discovered: refused at start, typed."""
    url = own_redis.url.replace("redis://", "redis+cluster://")
    with pytest.raises(InvalidOffloadArgument, match="not a Redis Cluster node"):
        RedisTier(url, 1024)


def test_a_cluster_down_at_start_is_unavailable_then_found(tmp_path: Path) -> None:
    """Down at start is not a misconfiguration: the tier is unavailable until the cluster
    answers, and the client is built at the first call that reaches it."""
    cluster = OwnRedisCluster(tmp_path, nodes=1)  # ports chosen, nothing listening yet
    tier = RedisTier(cluster.url, 1 << 20, prefix="kvgov-test-late", timeout=0.2)
    with pytest.raises(TierUnavailable, match="Redis Cluster at redis\\+cluster://"):
        tier.get(_key(1))
    try:
        cluster.start()
        tier.put(obj(1), NOW_US)
        got = tier.get(_key(1))
        assert got is not None and bytes(got.ciphertext) == bytes(obj(1).ciphertext)
    finally:
        tier.close()
        cluster.stop()


def test_tiers_of_one_process_share_one_cluster_client(
    redis_cluster: OwnRedisCluster, redis_cluster_prefix: str
) -> None:
    """Two tiers on one URL share a client; closing one leaves the other working."""
    url = redis_cluster.url.replace("127.0.0.1", "localhost")  # a URL no other test uses
    one = RedisTier(url, 1 << 20, name="a", prefix=redis_cluster_prefix)
    two = RedisTier(url, 1 << 20, name="b", prefix=redis_cluster_prefix)
    assert one._redis.client() is two._redis.client()
    one.close()
    two.put(obj(1), NOW_US)
    assert two.get(_key(1)) is not None
    client = two._redis.client()
    two.close()
    three = RedisTier(url, 1 << 20, name="b", prefix=redis_cluster_prefix)
    assert three._redis.client() is not client and three.get(_key(1)) is not None
    three.close()


@pytest.fixture()
def acl_user(redis_cluster: OwnRedisCluster, redis_cluster_prefix: str) -> Iterator[
    Callable[..., str]
]:  # fmt: skip
    """Make an ACL user on every node (ACLs are per node), limited to the test's prefix."""
    made: list[str] = []

    def make(*extra: str) -> str:
        user = f"fleet-{uuid.uuid4().hex[:8]}"
        for url in redis_cluster.node_urls():
            node = redis.Redis.from_url(url)
            node.acl_setuser(
                user,
                enabled=True,
                passwords=["+pw"],
                keys=[f"{redis_cluster_prefix}:*"],
                commands=[
                    "+@read",
                    "+@write",
                    "+@scripting",
                    "+@transaction",
                    "-@dangerous",
                    *extra,
                ],
            )
            node.close()
        made.append(user)
        return user

    yield make
    for url in redis_cluster.node_urls():
        node = redis.Redis.from_url(url)
        for user in made:
            node.acl_deluser(user)
        node.close()


def test_the_documented_acl_user_runs_the_tier_on_a_cluster(
    redis_cluster: OwnRedisCluster, redis_cluster_prefix: str, acl_user: Callable[..., str]
) -> None:
    """docs/fleet-kv.md's ACL, plus +cluster|slots and +command, is enough on a cluster."""
    user = acl_user("+cluster|slots", "+command")
    url = f"redis+cluster://{user}:pw@127.0.0.1:{redis_cluster.ports[0]}/0"
    by_port = _names_on_every_node(redis_cluster, uuid.uuid4().hex[:6])
    for name in by_port.values():
        tier = RedisTier(url, 1 << 20, name=name, prefix=redis_cluster_prefix)
        tier.put(obj(1), NOW_US)
        assert tier.exists([_key(1)]) == [True] and tier.get(_key(1)) is not None
        assert len(tier.delete_by_tenant("acme")) == 1 and tier.usage().stored_blocks == 0
        tier.close()


def test_an_acl_user_that_may_not_discover_the_cluster_is_refused_at_start(
    redis_cluster: OwnRedisCluster, redis_cluster_prefix: str, acl_user: Callable[..., str]
) -> None:
    """Without +cluster|slots the cluster client cannot find the nodes: a typed error that
    says what to grant. Behind a one-server URL the same user cannot be told from a
    server's user at start: a MOVED later is TierUnavailable naming the fix."""
    user = acl_user()
    seed = redis_cluster.ports[0]
    with pytest.raises(InvalidOffloadArgument, match="\\+cluster\\|slots"):
        RedisTier(f"redis+cluster://{user}:pw@127.0.0.1:{seed}/0", 1024)
    elsewhere = next(n for p, n in _names_on_every_node(redis_cluster, "x").items() if p != seed)
    tier = RedisTier(
        f"redis://{user}:pw@127.0.0.1:{seed}/0", 1024, name=elsewhere, prefix=redis_cluster_prefix
    )
    with pytest.raises(TierUnavailable, match=r"redirected.*redis\+cluster://"):
        tier.get(_key(1))
    tier.close()


def _move_slot(cluster: OwnRedisCluster, slot: int, to_port: int) -> None:
    """Reshard one slot with its keys to another node, as redis-cli --cluster reshard does."""
    nodes = {p: redis.Redis(port=p) for p in cluster.ports}
    ids = {p: n.cluster("myid").decode() for p, n in nodes.items()}
    src, dst = nodes[_owner(cluster, slot)], nodes[to_port]
    dst.cluster("setslot", slot, "importing", ids[_owner(cluster, slot)])
    src.cluster("setslot", slot, "migrating", ids[to_port])
    while keys := src.cluster("getkeysinslot", slot, 100):
        src.migrate("127.0.0.1", to_port, keys, 0, 5000)
    for port in (to_port, *[p for p in cluster.ports if p != to_port]):
        nodes[port].cluster("setslot", slot, "node", ids[to_port])
    deadline = time.monotonic() + 10
    while _owner(cluster, slot) != to_port:  # the seed learns it through the bus
        assert time.monotonic() < deadline, "the slot move did not propagate"
        time.sleep(0.05)
    for node in nodes.values():
        node.close()


def test_the_tier_follows_its_slot_to_another_node(
    redis_cluster: OwnRedisCluster, make_tier: Callable[..., Tier]
) -> None:
    """After a resharding moves the tier's slot, the client follows MOVED: the objects,
    index and counters moved with it, and every command works on the new node."""
    name = f"move-{uuid.uuid4().hex[:8]}"
    tier = make_tier("redis-cluster", name=name)
    assert isinstance(tier, RedisTier)
    for i in (1, 2, 3):
        tier.put(obj(i), NOW_US)
    slot = key_slot(tier.prefix.encode())
    before = _owner(redis_cluster, slot)
    _move_slot(redis_cluster, slot, next(p for p in redis_cluster.ports if p != before))
    assert tier.exists([_key(1), _key(4)]) == [True, False]
    got = tier.get(_key(2))
    assert got is not None and bytes(got.ciphertext) == bytes(obj(2).ciphertext)
    tier.put(obj(4), NOW_US)
    assert tier.usage().stored_blocks == 4
    assert len(tier.delete_by_tenant("acme")) == 4 and tier.usage().stored_bytes == 0


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
def test_refused_credentials_are_refused_at_start(
    scheme: str, redis_cluster: OwnRedisCluster, acl_user: Callable[..., str]
) -> None:
    """A wrong password is a misconfiguration, not Redis down: typed, at start."""
    user = acl_user("+cluster|slots", "+command")
    url = f"{scheme}://{user}:wrong@127.0.0.1:{redis_cluster.ports[0]}/0"
    with pytest.raises(InvalidOffloadArgument, match="refused the credentials") as info:
        RedisTier(url, 1024)
    assert "wrong" not in str(info.value)  # the URL is shown without its password
