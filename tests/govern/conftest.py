"""Fixtures for the governed cache: a tiny KV layout, a fake clock, scopes, caches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgov.allocator import KVSpec
from kvgov.govern import CacheScope, GovernedKVCache

SECRET = b"k" * 32
#: 4 tokens a block so tests reason in small numbers.
SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype=torch.float32)


class FakeClock:
    """A clock tests move by hand: retention is exact, nothing sleeps."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
