"""Tampered offload objects are refused, audited, and restored as nothing (a miss).

Each test alters what a tier holds as someone with write access to it could (the
host tier's memory, the disk tier's files), then admits the prompt again: the
admission must recompute from the altered block on, get zeroed blocks, and leave
an ``offload_refused`` event naming the tier, the reason and both tenants.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import AuditQueries
from kvgov.govern import GovernedKVCache
from kvgov.offload import DiskTier, Tier
from tests.support.offload import Raw

from .conftest import block_keys, fill, host_tier, make_scope, push_out, the_tier, tier_stats

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial
ACME, GLOBEX = make_scope(), make_scope(tenant="globex")


@pytest.fixture(params=["host", "disk"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Tier:
    """The tier under attack: the host tier, or the disk tier (named "host" for the policy)."""
    if request.param == "host":
        return host_tier()
    return DiskTier(tmp_path / "disk", 1 << 20, name="host", fsync=False)


@pytest.fixture()
def cache(make_offload_cache: Factory, tier: Tier) -> GovernedKVCache:
    """An 8-block cache over the tier, with acme's PROMPT sealed in it."""
    cache = make_offload_cache(tier, num_blocks=8)
    _write(cache, "a", ACME)
    push_out(cache)
    return cache


def _write(cache: GovernedKVCache, seq_id: str, scope: Any) -> None:
    adm = cache.admit(seq_id, scope, PROMPT)
    fill(cache, adm.block_ids, 5.0)
    cache.release(seq_id)


def _refused(cache: GovernedKVCache, url: str) -> list[Any]:
    cache.audit.flush()
    with AuditQueries(url) as q:
        return list(q.events(type="offload_refused"))


def _readmit(cache: GovernedKVCache, scope: Any = ACME) -> int:
    """Admit PROMPT again; every block past the hit must be zero. Returns the cached tokens."""
    adm = cache.admit("again", scope, PROMPT)
    for b in adm.block_ids[adm.cached_tokens // 4 :]:
        assert not cache.block(b).any()
    cache.release("again")
    cache._check_invariants()
    return adm.cached_tokens


def test_a_flipped_byte_is_refused_audited_and_a_miss(
    cache: GovernedKVCache, audit_url: str
) -> None:
    """One flipped bit in the second block's ciphertext: the first block is restored, no more."""
    raw = Raw(the_tier(cache))
    key = block_keys(cache, ACME, PROMPT)[1]
    data = bytearray(raw.read(key))
    data[-20] ^= 0x01
    raw.write(key, bytes(data))
    assert _readmit(cache) == 4
    (event,) = _refused(cache, audit_url)
    assert event.details["reason"] == "tampered" and event.details["tier"] == "host"
    assert (event.tenant, event.requester_tenant, event.sequence_id) == ("acme", "acme", "again")
    stats = cache.stats()
    assert stats.tenants["acme"].offload_refusals == 1
    assert tier_stats(cache).decrypt_failures == 1
    assert tier_stats(cache).refusals == {"tampered": 1}


def test_a_truncated_object_is_refused(cache: GovernedKVCache, audit_url: str) -> None:
    """Bytes cut off the first block: nothing is restored."""
    raw = Raw(the_tier(cache))
    raw.truncate(block_keys(cache, ACME, PROMPT)[0], 7)
    assert _readmit(cache) == 0
    (event,) = _refused(cache, audit_url)
    assert event.details["reason"] in ("corrupt", "tampered")


def test_two_swapped_objects_are_refused(cache: GovernedKVCache, audit_url: str) -> None:
    """The objects of blocks 0 and 1 swapped: each names another block key."""
    raw = Raw(the_tier(cache))
    k0, k1 = block_keys(cache, ACME, PROMPT)[:2]
    d0, d1 = raw.read(k0), raw.read(k1)
    raw.write(k0, d1)
    raw.write(k1, d0)
    assert _readmit(cache) == 0
    (event,) = _refused(cache, audit_url)
    assert event.details["reason"] == "misbound"


def test_a_replayed_old_object_is_refused(cache: GovernedKVCache, audit_url: str) -> None:
    """An object this worker has since replaced is refused when it is put back."""
    raw = Raw(the_tier(cache))
    key = block_keys(cache, ACME, PROMPT)[0]
    old = raw.read(key)
    assert _readmit(cache) == 12  # restored, cached again ...
    push_out(cache)  # ... and sealed anew
    assert raw.read(key) != old
    raw.write(key, old)
    assert _readmit(cache) == 0
    (event,) = _refused(cache, audit_url)
    assert event.details["reason"] == "replayed"


def test_an_object_moved_to_another_tenant_is_refused(
    cache: GovernedKVCache, audit_url: str
) -> None:
    """acme's first block copied over globex's (same tokens): globex restores nothing of it."""
    _write(cache, "g", GLOBEX)
    push_out(cache)
    raw = Raw(the_tier(cache))
    raw.write(block_keys(cache, GLOBEX, PROMPT)[0], raw.read(block_keys(cache, ACME, PROMPT)[0]))
    assert _readmit(cache, GLOBEX) == 0
    (event,) = _refused(cache, audit_url)
    assert event.details["reason"] == "misbound"
    assert (event.tenant, event.requester_tenant) == ("globex", "globex")
    assert _readmit(cache, ACME) == 12  # acme's own copy is untouched and still its own


def test_a_refused_block_can_be_written_and_cached_again(cache: GovernedKVCache) -> None:
    """After a refusal the recomputed block is sealed anew at its next eviction, and restored."""
    raw = Raw(the_tier(cache))
    key = block_keys(cache, ACME, PROMPT)[0]
    data = bytearray(raw.read(key))
    data[-1] ^= 0x80
    raw.write(key, bytes(data))
    assert _readmit(cache) == 0
    push_out(cache)
    assert _readmit(cache) == 12
