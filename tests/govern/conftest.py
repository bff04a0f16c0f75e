"""Fixtures for the governed cache: a tiny KV layout, a fake clock, scopes, caches, tiers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgov.allocator import KVSpec
from kvgov.govern import CacheScope, GovernedKVCache, OffloadConfig
from kvgov.govern.keys import pack_tokens
from kvgov.offload import HostMemoryTier, LocalKEK, Tier
from tests.support.clock import FakeClock
from tests.support.native import native_keychain_skip
from tests.support.redis import (  # noqa: F401 - shared fixtures
    own_redis,
    redis_cluster,
    redis_cluster_prefix,
    redis_prefix,
    redis_target,
)

SECRET = b"k" * 32
#: 4 tokens a block so tests reason in small numbers.
SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype=torch.float32)


def _native_param() -> Any:
    why = native_keychain_skip()
    return pytest.param("native", marks=pytest.mark.skip(reason=why)) if why else "native"


#: Both key-chain implementations, for tests that must hold in each (``implementation=``).
KEYCHAIN_IMPLS = ["python", _native_param()]


def make_scope(**overrides: Any) -> CacheScope:
    """A valid scope; keyword arguments replace fields."""
    fields: dict[str, Any] = {
        "tenant": "acme",
        "classification": "internal",
        "model": "llama-3-8b",
        "model_revision": "r1",
        "tokenizer": "llama3",
        "tokenizer_revision": "v1",
        "template_version": "sys-v3",
    }
    fields.update(overrides)
    return CacheScope(**fields)


def share_group(name: str, *tenants: str) -> dict[str, Any]:
    """Policy data granting a public share group to the tenants (publishers and readers)."""
    return {
        "kvgov": {
            "config": {
                "share_groups": {name: {"publishers": list(tenants), "classifications": ["public"]}}
            }
        }
    }


def tenant_config(tenant: str, **settings: Any) -> dict[str, Any]:
    """Policy data overriding one tenant's settings."""
    return {"kvgov": {"config": {"tenants": {tenant: settings}}}}


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def audit_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'audit.db'}"


@pytest.fixture()
def make_cache(audit_url: str, clock: FakeClock) -> Iterator[Callable[..., GovernedKVCache]]:
    """Build caches on the test's audit database and clock; all closed at the end."""
    made: list[GovernedKVCache] = []

    def factory(num_blocks: int = 32, **kwargs: Any) -> GovernedKVCache:
        kwargs.setdefault("key_secret", SECRET)
        kwargs.setdefault("audit_url", audit_url)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("verify_zeroization", True)
        cache = GovernedKVCache.create(spec=SPEC, num_blocks=num_blocks, **kwargs)
        made.append(cache)
        return cache

    yield factory
    for cache in made:
        cache.close()


def fill(
    cache: GovernedKVCache, block_ids: tuple[int, ...] | list[int], value: float = 7.0
) -> None:
    """Write non-zero KV into blocks, as a model's forward pass would."""
    for b in block_ids:
        cache.block(b).fill_(value)


# --------------------------------------------------------------------------- offload

#: The KEK of the offload tests (every cache of a test shares it, as a fleet does).
KEK = LocalKEK(bytes(range(32)))
#: A tenant whose admissions push every cached block out of a small pool.
FILLER = "filler"


def host_tier(capacity: int = 1 << 20, **kwargs: Any) -> HostMemoryTier:
    """A host tier without pinned memory (no CUDA needed)."""
    return HostMemoryTier(capacity, pin_memory=False, **kwargs)


def offload_tiers(**by_classification: list[str]) -> dict[str, Any]:
    """Policy data naming the tiers each classification may be offloaded to."""
    return {"kvgov": {"config": {"offload_tiers": by_classification}}}


def merged(*datas: dict[str, Any]) -> dict[str, Any]:
    """Policy data dicts deep-merged, later ones winning."""
    out: dict[str, Any] = {}
    for data in datas:
        _merge(out, data)
    return out


def _merge(into: dict[str, Any], data: dict[str, Any]) -> None:
    for k, v in data.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


@pytest.fixture()
def make_offload_cache(
    make_cache: Callable[..., GovernedKVCache],
) -> Callable[..., GovernedKVCache]:
    """Build caches with offload tiers (a host tier unless given), the test KEK, 4 blocks."""

    def factory(*tiers: Tier, num_blocks: int = 4, **kwargs: Any) -> GovernedKVCache:
        config = OffloadConfig(tiers=list(tiers) or [host_tier()], kek=KEK)
        return make_cache(num_blocks, offload=config, **kwargs)

    return factory


def push_out(cache: GovernedKVCache) -> None:
    """Evict every cached block for capacity: a filler tenant takes the whole pool, then cancels."""
    tokens = list(range(900_000, 900_000 + cache.num_blocks * cache.spec.block_size))
    cache.admit("push-out", make_scope(tenant=FILLER), tokens)
    cache.cancel("push-out")


def tier_stats(cache: GovernedKVCache, tier: str = "host") -> Any:
    """The offload counters of one tier."""
    snap = cache.stats().offload
    assert snap is not None
    return snap.tiers[tier]


def block_keys(cache: GovernedKVCache, scope: CacheScope, tokens: list[int]) -> list[bytes]:
    """The cache keys of a prompt's full blocks, keyed in the scope's own namespace."""
    gov = cache.governor
    view = gov.ledger.views.view(scope)
    bs = cache.spec.block_size
    return list(
        gov.deriver.derive_chain(
            view.own_root, pack_tokens(tokens), view.digest, bs, len(tokens) // bs
        )
    )


def the_tier(cache: GovernedKVCache, name: str = "host") -> Tier:
    """A cache's offload tier, for tests that reach into it as an attacker would."""
    offload = cache.governor.offload
    assert offload is not None
    return offload.store._states[name].tier
