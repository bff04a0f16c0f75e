"""Public prefixes: a shared system prompt reused across tenants only where policy grants it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgov.audit import AuditQueries
from kvgov.govern import GovernedKVCache

from .conftest import fill, make_scope, share_group

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(200, 221))  # 21 tokens: 5 full blocks of 4 and one partial
PREFIX = 8  # the first two blocks are a public system prompt


def _admit_release(cache: GovernedKVCache, seq: str, tenant: str) -> int:
    adm = cache.admit(seq, make_scope(tenant=tenant), PROMPT, public_prefix_tokens=PREFIX)
    fill(cache, adm.block_ids)
    cache.release(seq)
    return adm.cached_tokens


def _readers_group() -> dict[str, Any]:
    groups = {"sys": {"publishers": ["bank"], "readers": ["clinic"], "classifications": ["public"]}}
    return {"kvgov": {"config": {"share_groups": groups}}}


def test_same_tenant_reuses_prefix_and_rest(make_cache: Factory) -> None:
    """The tenant's own second request hits the public prefix and its private rest."""
    cache = make_cache()
    assert _admit_release(cache, "a", "bank") == 0
    assert _admit_release(cache, "b", "bank") == 20


def test_publishers_share_only_the_prefix(make_cache: Factory, audit_url: str) -> None:
    """A co-publisher reuses the prefix blocks, never the first tenant's internal rest."""
    cache = make_cache(policy_data=share_group("sys", "bank", "clinic"))
    _admit_release(cache, "a", "bank")
    assert _admit_release(cache, "b", "clinic") == PREFIX
    cache.audit.flush()
    reuse = list(AuditQueries(audit_url).events(type="cross_tenant_reuse"))
    assert [(e.tenant, e.requester_tenant, e.reused_tokens) for e in reuse] == [
        ("bank", "clinic", PREFIX)
    ]


def test_no_share_group_no_cross_tenant_prefix_hit(make_cache: Factory) -> None:
    """Without a grant a public prefix stays in its tenant's namespace."""
    cache = make_cache()
    _admit_release(cache, "a", "bank")
    assert _admit_release(cache, "b", "clinic") == 0


def test_reader_finds_the_publishers_prefix(make_cache: Factory) -> None:
    """A read-only member looks the prefix up in the group it may read, then its own rest."""
    cache = make_cache(policy_data=_readers_group())
    _admit_release(cache, "a", "bank")
    assert _admit_release(cache, "b", "clinic") == PREFIX
    assert _admit_release(cache, "c", "clinic") == 20
    assert cache.stats().tenants["clinic"].cross_tenant_reuses == 2


def test_tenant_outside_the_group_finds_nothing(make_cache: Factory) -> None:
    """A tenant neither publishing to nor reading the group gets no hit."""
    cache = make_cache(policy_data=_readers_group())
    _admit_release(cache, "a", "bank")
    assert _admit_release(cache, "b", "other") == 0


def test_a_reader_does_not_publish_into_the_group(make_cache: Factory) -> None:
    """What a reader caches stays its own: a publisher does not hit it."""
    cache = make_cache(policy_data=_readers_group())
    _admit_release(cache, "a", "clinic")
    assert _admit_release(cache, "b", "bank") == 0
