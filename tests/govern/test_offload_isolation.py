"""Isolation holds through the offload tiers: nothing sealed for one scope is restored into another.

The adversarial cases of tests/govern/test_cache.py, with the first scope's blocks
pushed out of the device into a tier before the second scope asks: the tier is
then the only place the KV could come from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvgov.govern import GovernedKVCache
from kvgov.offload import DiskTier

from .conftest import (
    fill,
    host_tier,
    make_scope,
    offload_tiers,
    push_out,
    share_group,
    tier_stats,
)

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial
#: Every classification may use both tiers here, so a scope change is all that differs.
ALL_TIERS = offload_tiers(
    public=["host", "disk"], internal=["host", "disk"], confidential=["host", "disk"]
)


def _offloaded_then(cache: GovernedKVCache, first: Any, second: Any) -> int:
    """``first`` writes PROMPT, it is pushed into the tiers, ``second`` asks: its cached tokens."""
    adm = cache.admit("first", first, PROMPT)
    fill(cache, adm.block_ids)
    cache.release("first")
    push_out(cache)
    assert tier_stats(cache).puts == 3
    got = cache.admit("second", second, PROMPT)
    assert all(not cache.block(b).any() for b in got.block_ids[got.cached_tokens // 4 :])
    cache.release("second")
    return got.cached_tokens


@pytest.fixture()
def cache(make_offload_cache: Factory, tmp_path: Path) -> GovernedKVCache:
    """A 4-block cache with a host and a disk tier, both allowed for every label but restricted."""
    disk = DiskTier(tmp_path / "disk", 1 << 20, fsync=False)
    return make_offload_cache(host_tier(), disk, policy_data=ALL_TIERS)


def test_the_same_scope_is_restored(cache: GovernedKVCache) -> None:
    """The control: the same scope gets its prefix back from the host tier."""
    assert _offloaded_then(cache, make_scope(), make_scope()) == 12


@pytest.mark.parametrize(
    "change",
    [
        {"tenant": "globex"},
        {"classification": "confidential"},
        {"model": "llama-3-70b"},
        {"model_revision": "r2"},
        {"adapter": "lora-fin", "adapter_revision": "a1"},
        {"tokenizer": "llama3-alt"},
        {"tokenizer_revision": "v2"},
        {"template_version": "sys-v4"},
        {"tenant": "\u0430cme"},  # Cyrillic a: a lookalike tenant is another tenant
    ],
    ids=lambda c: ",".join(c),
)
def test_no_restore_across_any_scope_field(cache: GovernedKVCache, change: dict[str, str]) -> None:
    """Same tokens, one scope field different: no tier gives anything back."""
    assert _offloaded_then(cache, make_scope(), make_scope(**change)) == 0
    assert tier_stats(cache, "host").hits == 0 and tier_stats(cache, "disk").hits == 0
    assert cache.stats().total.offload_refusals == 0  # another key: nothing even looked at


def test_no_restore_across_adapter_revisions(cache: GovernedKVCache) -> None:
    """Two revisions of one adapter never share KV through a tier."""
    one = make_scope(adapter="lora", adapter_revision="a1")
    two = make_scope(adapter="lora", adapter_revision="a2")
    assert _offloaded_then(cache, one, two) == 0


def test_separator_games_do_not_collide_in_a_tier(cache: GovernedKVCache) -> None:
    """("a|b", "c") and ("a", "b|c") in model and revision are different scopes in a tier too."""
    one = make_scope(model="a|b", model_revision="c")
    two = make_scope(model="a", model_revision="b|c")
    assert _offloaded_then(cache, one, two) == 0


def test_no_restore_across_secrets(cache: GovernedKVCache) -> None:
    """After a secret rotation the tiers are emptied, and old keys would not be asked for."""
    scope = make_scope()
    adm = cache.admit("a", scope, PROMPT)
    fill(cache, adm.block_ids)
    cache.release("a")
    push_out(cache)
    cache.rotate_secret(b"n" * 32)
    assert cache.admit("b", scope, PROMPT).cached_tokens == 0
    assert tier_stats(cache).stored_blocks == 0


def test_a_share_group_does_not_open_the_tiers_to_another_tenant(
    make_offload_cache: Factory,
) -> None:
    """Public blocks shared on the device by a group are never restored from a tier, and a
    tenant outside the group finds nothing either."""
    cache = make_offload_cache(
        policy_data=share_group("public-prompts", "bank", "clinic"),
    )
    bank = make_scope(tenant="bank", classification="public")
    adm = cache.admit("a", bank, PROMPT)
    fill(cache, adm.block_ids)
    cache.release("a")
    push_out(cache)
    for tenant in ("clinic", "other", "bank"):
        got = cache.admit(tenant, make_scope(tenant=tenant, classification="public"), PROMPT)
        assert got.cached_tokens == 0
        cache.release(tenant)
    stats = cache.stats()
    assert stats.tenants["bank"].blocks_offloaded == 0  # published in the group
    assert stats.tenants["clinic"].blocks_offloaded == 0
    assert stats.tenants["other"].blocks_offloaded == 3  # its own namespace: its own
    assert tier_stats(cache).hits == 0


def test_public_data_of_a_tenant_without_a_group_stays_its_own(cache: GovernedKVCache) -> None:
    """Public data is tenant-private without a share grant, in the tiers as on the device."""
    bank = make_scope(tenant="bank", classification="public")
    clinic = make_scope(tenant="clinic", classification="public")
    assert _offloaded_then(cache, bank, clinic) == 0
