"""OffloadConfig and tier URLs: what GovernedKVCache.create(offload=...) builds, and refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy

from kvgov.exceptions import InvalidArgument, InvalidOffloadArgument, KEKError
from kvgov.govern import GovernedKVCache, OffloadConfig, parse_tier_url
from kvgov.govern.offload_config import parse_size
from kvgov.offload import DiskTier, HostMemoryTier, RedisTier
from tests.support.redis import OwnRedisCluster

from .conftest import KEK, SECRET, SPEC, fill, make_scope, push_out, tier_stats

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))
KEK_HEX = "11" * 32


def test_a_host_url_builds_a_host_tier() -> None:
    """host://?capacity=...: name and pinning from the query."""
    tier = parse_tier_url("host://?capacity=8MiB&name=ram&pin=0")
    assert isinstance(tier, HostMemoryTier)
    assert (tier.name, tier.capacity_bytes, tier.pinned) == ("ram", 8 << 20, False)


def test_a_disk_url_builds_a_disk_tier(tmp_path: Path) -> None:
    """disk:///path?capacity=...: the directory is the URL's path."""
    tier = parse_tier_url(f"disk://{tmp_path}/kv?capacity=1.5GB&fsync=0")
    assert isinstance(tier, DiskTier)
    assert (tier.name, tier.capacity_bytes, tier.root) == ("disk", 1_500_000_000, tmp_path / "kv")
    tier.close()


def test_a_redis_url_keeps_its_own_options_for_redis_py() -> None:
    """redis:// and rediss://: kvgov's options are taken out, the rest is redis-py's."""
    tier = parse_tier_url("redis://127.0.0.1:6379/0?capacity=1GiB&prefix=fleet&name=shared")
    assert isinstance(tier, RedisTier)
    assert (tier.name, tier.prefix, tier.capacity_bytes) == ("shared", "fleet:{shared}", 1 << 30)
    tier.close()
    tls = parse_tier_url("rediss://cache.internal:6380/0?capacity=1GiB&ssl_cert_reqs=required")
    assert tls.name == "redis"
    tls.close()


def test_a_redis_cluster_url_builds_a_cluster_tier(redis_cluster: OwnRedisCluster) -> None:
    """redis+cluster://: the same tier on a Redis Cluster, found from one seed node."""
    seed = redis_cluster.url.split("://", 1)[1].split("/", 1)[0]
    tier = parse_tier_url(f"redis+cluster://{seed}/0?capacity=1MiB&prefix=kvgov-test-cfg&name=c")
    assert isinstance(tier, RedisTier) and tier._redis.cluster
    assert (tier.name, tier.prefix, tier.usage().stored_blocks) == ("c", "kvgov-test-cfg:{c}", 0)
    tier.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("host://", "capacity"),
        ("host://?capacity=lots", "size"),
        ("host://?capacity=0", "positive"),
        ("host://?capacity=1GiB&colour=blue", "unknown option"),
        ("host://?capacity=1GiB&pin=maybe", "1 or 0"),
        ("s3://bucket?capacity=1GiB", "scheme"),
        ("disk://?capacity=1GiB", "directory"),
        ("redis://h/0?capacity=1GiB&timeout=-1", "seconds"),
    ],
)
def test_bad_tier_urls_are_refused_with_what_to_write(url: str, message: str) -> None:
    """Every mistake names itself: a typed error whose message says what is accepted."""
    with pytest.raises(InvalidArgument, match=message):
        parse_tier_url(url)


def test_sizes_take_binary_and_decimal_units() -> None:
    """512MiB, 8GiB, 1.5GB and plain bytes."""
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("8 GiB") == 8 << 30
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("4096") == 4096


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1k", 1000), ("1KiB", 1024), ("2 tib", 2 << 40), (" 8GiB ", 8 << 30), (".5GiB", 1 << 29)],
)
def test_sizes_follow_pydantic_bytesize(text: str, expected: int) -> None:
    """Units in any case, K/M/G alone are decimal, a fraction is rounded down to bytes."""
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8GiBx", "a size such as"),  # humanfriendly would read this as 8 GB
        ("8GiB foo", "a size such as"),  # ByteSize alone would read this as 8 GiB
        ("-1GiB", "a size such as"),
        ("1e3", "a size such as"),
        ("", "a size such as"),
        ("0", "must be positive"),
        ("1bit", "must be positive"),  # an eighth of a byte
    ],
)
def test_sizes_refuse_typos_and_non_positive_values(text: str, message: str) -> None:
    """A unit that is not one, trailing words, a sign or an exponent: refused, naming what is."""
    with pytest.raises(InvalidArgument, match=message):
        parse_size(text)


def test_a_config_needs_tiers() -> None:
    """An empty list, or a lone URL string instead of a list, is refused."""
    for tiers in ([], "host://?capacity=1MiB"):
        with pytest.raises(InvalidArgument, match="tier URLs"):
            OffloadConfig(tiers=tiers)  # type: ignore[arg-type]


def test_two_tiers_with_one_name_are_refused(make_cache: Factory) -> None:
    """Tier names are bound into objects and asked of the policy: they must differ."""
    config = OffloadConfig(
        tiers=["host://?capacity=1MiB&pin=0", "host://?capacity=1MiB&pin=0"], kek=KEK
    )
    with pytest.raises(InvalidOffloadArgument, match="differ"):
        make_cache(offload=config, key_secret=SECRET)


def test_the_kek_comes_from_the_environment(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch, audit_url: str
) -> None:
    """kek=None reads KVGOV_KEK; the wrapped key lands in the audit database's key table."""
    monkeypatch.setenv("KVGOV_KEK", KEK_HEX)
    cache = make_cache(4, offload=OffloadConfig(tiers=["host://?capacity=1MiB&pin=0"]))
    adm = cache.admit("a", make_scope(), PROMPT)
    fill(cache, adm.block_ids)
    cache.release("a")
    push_out(cache)
    assert tier_stats(cache).puts == 3
    engine = sqlalchemy.create_engine(audit_url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT tenant, kek_id FROM offload_keys")).all()
    engine.dispose()
    assert [r.tenant for r in rows] == ["acme"] and rows[0].kek_id.startswith("local:")


def test_no_kek_anywhere_refuses_to_start(monkeypatch: pytest.MonkeyPatch, audit_url: str) -> None:
    """Offload without a KEK is a configuration error that says how to make one."""
    monkeypatch.delenv("KVGOV_KEK", raising=False)
    monkeypatch.delenv("KVGOV_KEK_FILE", raising=False)
    with pytest.raises(KEKError, match="KVGOV_KEK"):
        GovernedKVCache.create(
            spec=SPEC,
            num_blocks=4,
            audit_url=audit_url,
            key_secret=SECRET,
            offload=OffloadConfig(tiers=["host://?capacity=1MiB&pin=0"]),
        )


def test_a_tier_the_policy_does_not_name_receives_nothing(make_cache: Factory) -> None:
    """A tier called "fast" is in no offload_tiers list: every block is denied to it."""
    config = OffloadConfig(tiers=["host://?capacity=1MiB&pin=0&name=fast"], kek=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGOV_KEK", KEK_HEX)
        cache = make_cache(4, offload=config)
    cache.admit("a", make_scope(), PROMPT)
    cache.release("a")
    push_out(cache)
    snap = cache.stats().offload
    assert snap is not None and snap.policy_denied == {"fast": 3}
    assert snap.tiers["fast"].puts == 0
