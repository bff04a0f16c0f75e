"""Isolation through the tiers: a block offloaded for one scope is never restored for another.

The same adversarial cases as the device isolation suite, at the store level and for
every tier kind: another tenant, another scope, a shared block key with another owner,
an object planted under the requester's key. Each is refused, and never deleted for
its owner by a requester who may not read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from kvgov.offload import MissReason, OffloadStore, Tier
from kvgov.offload.objects import encode
from tests.support.clock import START
from tests.support.offload import Raw

from .conftest import TIER_KINDS

A_KEY, B_KEY = b"A" * 32, b"B" * 32
SCOPE, OTHER_SCOPE = b"S" * 32, b"T" * 32
PAYLOAD = b"acme's prompt KV " * 64


@pytest.fixture(params=TIER_KINDS)
def one_tier(
    request: pytest.FixtureRequest,
    make_tier: Callable[..., Tier],
    make_store: Callable[..., OffloadStore],
) -> OffloadStore:
    """A store over one tier of each kind."""
    return make_store([make_tier(request.param)])


def test_the_owner_scope_restores(one_tier: OffloadStore) -> None:
    """The control case: the same block key, scope digest and tenant restores the payload."""
    one_tier.offload(A_KEY, SCOPE, "acme", START + 60, PAYLOAD)
    assert one_tier.restore(A_KEY, SCOPE, "acme").payload == PAYLOAD  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("scope", "tenant"),
    [(SCOPE, "beta"), (OTHER_SCOPE, "acme"), (OTHER_SCOPE, "beta")],
    ids=["other-tenant", "other-scope", "both"],
)
def test_another_scope_never_gets_the_block(
    one_tier: OffloadStore, scope: bytes, tenant: str
) -> None:
    """Asked for by another tenant or scope, the object is refused (misbound) and kept."""
    one_tier.offload(A_KEY, SCOPE, "acme", START + 60, PAYLOAD)
    miss = one_tier.restore(A_KEY, scope, tenant)
    assert not miss.hit and miss.reason is MissReason.MISBOUND
    assert [r.reason for r in miss.refusals] == [MissReason.MISBOUND]
    assert one_tier.restore(A_KEY, SCOPE, "acme").hit  # the owner still has it


def test_a_block_planted_under_another_key_is_refused(one_tier: OffloadStore) -> None:
    """acme's object copied to beta's block key is refused for beta (it names acme's key)."""
    one_tier.offload(A_KEY, SCOPE, "acme", START + 60, PAYLOAD)
    one_tier.offload(B_KEY, SCOPE, "beta", START + 60, b"beta's own" * 8)
    raw = Raw(one_tier._states[one_tier.tier_names[0]].tier)
    raw.write(B_KEY, raw.read(A_KEY))
    miss = one_tier.restore(B_KEY, SCOPE, "beta")
    assert not miss.hit and miss.reason is MissReason.MISBOUND


def test_a_planted_block_with_a_rewritten_header_fails_authentication(
    one_tier: OffloadStore,
) -> None:
    """The same with the header rewritten to beta's key, scope and tenant: the AAD fails."""
    one_tier.offload(A_KEY, SCOPE, "acme", START + 60, PAYLOAD)
    one_tier.offload(B_KEY, SCOPE, "beta", START + 60, b"beta's own" * 8)
    tier = one_tier._states[one_tier.tier_names[0]].tier
    raw = Raw(tier)
    acme_obj, beta_obj = tier.get(A_KEY), tier.get(B_KEY)
    assert acme_obj is not None and beta_obj is not None
    # header of beta's object (its key id, tenant, scope), ciphertext of acme's
    forged = dataclasses.replace(beta_obj, ciphertext=bytes(acme_obj.ciphertext)[:80])
    raw.write(B_KEY, encode(forged))
    miss = one_tier.restore(B_KEY, SCOPE, "beta")
    assert not miss.hit and miss.reason is MissReason.TAMPERED


def test_a_shared_block_key_is_kept_for_its_owner(one_tier: OffloadStore) -> None:
    """A share-group block key sealed by acme is refused for beta, and acme still restores it."""
    one_tier.offload(A_KEY, SCOPE, "acme", START + 60, PAYLOAD)
    for _ in range(3):
        assert not one_tier.restore(A_KEY, SCOPE, "beta").hit
    assert one_tier.restore(A_KEY, SCOPE, "acme").hit


def test_a_second_tenant_cannot_read_through_its_own_key(
    one_tier: OffloadStore,
) -> None:
    """beta offloading its own blocks gains nothing: acme's object stays acme's only."""
    one_tier.offload(A_KEY, SCOPE, "acme", START + 60, PAYLOAD)
    one_tier.offload(B_KEY, SCOPE, "beta", START + 60, PAYLOAD)
    miss = one_tier.restore(A_KEY, SCOPE, "beta")
    assert not miss.hit
    assert one_tier.restore(B_KEY, SCOPE, "beta").hit
