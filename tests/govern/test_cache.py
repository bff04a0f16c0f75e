"""GovernedKVCache: the request path and the adversarial isolation suite."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvgov.audit import AuditQueries
from kvgov.exceptions import (
    DuplicateSequence,
    InvalidArgument,
    InvalidScope,
    InvalidTokens,
    KeySecretError,
    OutOfBlocks,
    PolicyDenied,
    PoolClosed,
    UnknownSequence,
)
from kvgov.govern import GovernedKVCache

from .conftest import SECRET, SPEC, fill, make_scope, share_group, tenant_config

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial


def _hit_after_release(cache: GovernedKVCache, first: Any, second: Any, tokens: list[int]) -> int:
    adm = cache.admit("first", first, tokens)
    fill(cache, adm.block_ids)
    cache.release("first")
    got = cache.admit("second", second, tokens).cached_tokens
    cache.release("second")
    return got


def _events(cache: GovernedKVCache, url: str, **filters: Any) -> list[Any]:
    cache.audit.flush()
    return list(AuditQueries(url).events(**filters))


def test_same_scope_reuses_the_prefix(make_cache: Factory) -> None:
    """A second identical prompt in the same scope reuses every full block but the last token's."""
    cache = make_cache()
    scope = make_scope()
    assert _hit_after_release(cache, scope, scope, PROMPT) == 12


def test_at_least_one_token_is_left_to_compute(make_cache: Factory) -> None:
    """A prompt whose every block is cached still leaves its last block to compute."""
    cache = make_cache()
    scope = make_scope()
    assert _hit_after_release(cache, scope, scope, PROMPT[:12]) == 8


def test_hit_while_first_sequence_is_live(make_cache: Factory) -> None:
    """Blocks are keyed at admission, so a concurrent identical prompt shares them."""
    cache = make_cache()
    a = cache.admit("a", make_scope(), PROMPT)
    b = cache.admit("b", make_scope(), PROMPT)
    assert b.cached_tokens == 12
    assert b.block_ids[:3] == a.block_ids[:3]
    assert b.block_ids[3] != a.block_ids[3]


#: One scope field changed at a time: nothing may be reused across any of them (the
#: vLLM binding's isolation suite runs the same cases through vLLM's scheduler).
SCOPE_CHANGES: list[dict[str, str]] = [
    {"tenant": "globex"},
    {"classification": "confidential"},
    {"model": "llama-3-70b"},
    {"model_revision": "r2"},
    {"adapter": "lora-fin", "adapter_revision": "a1"},
    {"tokenizer": "llama3-alt"},
    {"tokenizer_revision": "v2"},
    {"template_version": "sys-v4"},
    {"tenant": "\u0430cme"},  # Cyrillic a: a lookalike tenant is another tenant
]


@pytest.mark.parametrize("change", SCOPE_CHANGES, ids=lambda c: ",".join(c))
def test_no_hit_across_any_scope_field(make_cache: Factory, change: dict[str, str]) -> None:
    """Same tokens, one scope field different: nothing is reused."""
    cache = make_cache()
    assert _hit_after_release(cache, make_scope(), make_scope(**change), PROMPT) == 0


def test_no_hit_across_adapter_revisions(make_cache: Factory) -> None:
    """Two revisions of one adapter never share KV."""
    cache = make_cache()
    one = make_scope(adapter="lora", adapter_revision="a1")
    two = make_scope(adapter="lora", adapter_revision="a2")
    assert _hit_after_release(cache, one, two, PROMPT) == 0


def test_separator_games_do_not_collide(make_cache: Factory) -> None:
    """("a|b", "c") and ("a", "b|c") in model and revision are different scopes."""
    cache = make_cache()
    one = make_scope(model="a|b", model_revision="c")
    two = make_scope(model="a", model_revision="b|c")
    assert _hit_after_release(cache, one, two, PROMPT) == 0


def test_no_hit_across_secrets(make_cache: Factory, tmp_path: Any) -> None:
    """Rotating the secret makes every old key unreachable and zeroizes cached blocks."""
    cache = make_cache()
    scope = make_scope()
    adm = cache.admit("a", scope, PROMPT)
    fill(cache, adm.block_ids)
    cache.release("a")
    dropped = cache.rotate_secret(b"n" * 32)
    assert dropped == 3
    for b in adm.block_ids:
        assert not cache.block(b).any()
    assert cache.admit("b", scope, PROMPT).cached_tokens == 0


def test_share_group_lets_a_second_tenant_hit_public_blocks(
    make_cache: Factory, audit_url: str
) -> None:
    """With a share grant, tenant B reuses tenant A's public blocks and audit names both."""
    cache = make_cache(policy_data=share_group("public-prompts", "bank", "clinic"))
    bank = make_scope(tenant="bank", classification="public")
    clinic = make_scope(tenant="clinic", classification="public")
    assert _hit_after_release(cache, bank, clinic, PROMPT) == 12
    events = _events(cache, audit_url, type="cross_tenant_reuse")
    assert len(events) == 1
    assert events[0].tenant == "bank" and events[0].requester_tenant == "clinic"
    assert events[0].reused_tokens == 12
    assert cache.stats().tenants["clinic"].cross_tenant_reuses == 1


def test_share_group_never_covers_confidential(make_cache: Factory) -> None:
    """A share group for public data does not open confidential blocks to the other tenant."""
    cache = make_cache(policy_data=share_group("public-prompts", "bank", "clinic"))
    bank = make_scope(tenant="bank", classification="confidential")
    clinic = make_scope(tenant="clinic", classification="confidential")
    assert _hit_after_release(cache, bank, clinic, PROMPT) == 0


def test_no_share_group_no_cross_tenant_public_hit(make_cache: Factory) -> None:
    """Public data is still tenant-private without a share grant."""
    cache = make_cache()
    bank = make_scope(tenant="bank", classification="public")
    clinic = make_scope(tenant="clinic", classification="public")
    assert _hit_after_release(cache, bank, clinic, PROMPT) == 0


def test_tenant_outside_the_group_cannot_hit(make_cache: Factory) -> None:
    """A third tenant not in the share group finds nothing of the group's blocks."""
    cache = make_cache(policy_data=share_group("public-prompts", "bank", "clinic"))
    bank = make_scope(tenant="bank", classification="public")
    other = make_scope(tenant="other", classification="public")
    assert _hit_after_release(cache, bank, other, PROMPT) == 0


def test_evicted_block_handed_to_a_new_scope_reads_zero(make_cache: Factory) -> None:
    """Capacity eviction zeroizes: the next scope's fresh blocks hold no old KV."""
    cache = make_cache(num_blocks=4)
    adm = cache.admit("a", make_scope(), PROMPT)
    fill(cache, adm.block_ids, 3.0)
    cache.release("a")
    other = cache.admit("b", make_scope(tenant="globex"), list(range(16)))
    assert set(other.block_ids) & set(adm.block_ids)
    for b in other.block_ids:
        assert not cache.block(b).any()
    stats = cache.stats()
    assert stats.tenants["acme"].evictions.get("capacity") == 3


def test_restricted_is_admitted_but_never_cached(make_cache: Factory) -> None:
    """Restricted data gets blocks, and nothing of it is kept or found after release."""
    cache = make_cache()
    scope = make_scope(classification="restricted")
    adm = cache.admit("a", scope, PROMPT)
    assert not adm.cacheable
    fill(cache, adm.block_ids)
    cache.release("a")
    for b in adm.block_ids:
        assert not cache.block(b).any()
    assert cache.admit("b", scope, PROMPT).cached_tokens == 0
    assert cache.stats().total.blocks_by_state["cached"] == 0


def test_append_keys_blocks_as_they_fill(make_cache: Factory) -> None:
    """Decode growth keys each block that becomes full, so a longer prompt later reuses it."""
    cache = make_cache()
    scope = make_scope()
    adm = cache.admit("a", scope, PROMPT[:6])
    assert len(adm.block_ids) == 2
    new = cache.append("a", PROMPT[6:13])
    assert len(new) == 2
    cache.release("a")
    assert cache.admit("b", scope, PROMPT).cached_tokens == 12


def test_append_within_a_block_allocates_nothing(make_cache: Factory) -> None:
    """Tokens that fit the partial block need no new block."""
    cache = make_cache()
    cache.admit("a", make_scope(), [1, 2])
    assert cache.append("a", [3]) == []
    assert cache.append("a", []) == []


def test_release_is_idempotent(make_cache: Factory) -> None:
    """A second release is a no-op that says so."""
    cache = make_cache()
    cache.admit("a", make_scope(), PROMPT)
    assert cache.release("a") is True
    assert cache.release("a") is False
    assert cache.release("never") is False


def test_policy_denial_raises_and_is_audited(make_cache: Factory, audit_url: str) -> None:
    """A denied admission raises PolicyDenied with its decision id, written to audit."""
    cache = make_cache(policy_data=tenant_config("acme", admission=False))
    with pytest.raises(PolicyDenied) as info:
        cache.admit("a", make_scope(), PROMPT)
    assert "admission disabled" in info.value.reason
    events = _events(cache, audit_url, type="policy_denied")
    assert [e.decision_id for e in events] == [info.value.decision_id]
    assert cache.stats().total.requests == 0
    assert sum(cache.stats().tenants["acme"].denials.values()) == 1


def test_unknown_classification_is_an_invalid_scope(make_cache: Factory) -> None:
    """A label the policy does not know is refused before anything happens."""
    cache = make_cache()
    with pytest.raises(InvalidScope) as info:
        cache.admit("a", make_scope(classification="top-secret"), PROMPT)
    assert info.value.field == "classification"


def _snapshot(cache: GovernedKVCache) -> tuple[Any, ...]:
    s = cache.stats()
    cache.pool._check_invariants()
    return (s.total.requests, s.live_sequences, dict(s.total.blocks_by_state))


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.admit("a", make_scope(), [1, -2]),
        lambda c: c.admit("a", make_scope(), [1.0, 2.0]),
        lambda c: c.admit("", make_scope(), [1]),
        lambda c: c.admit("x", make_scope(), [1], priority=101),
        lambda c: c.admit("x", "not a scope", [1]),
        lambda c: c.admit("live", make_scope(), [1]),
        lambda c: c.append("nope", [1]),
        lambda c: c.append("live", [2**32]),
        lambda c: c.admit("big", make_scope(), list(range(4 * 40))),
        lambda c: c.admit("nul\x00id", make_scope(), [1]),
        lambda c: c.admit("x" * 1000, make_scope(), [1]),
        lambda c: c.admit("set", make_scope(), {1, 2, 3, 4, 5}),
        lambda c: c.admit("dict", make_scope(), {1: 2, 3: 4}),
        lambda c: c.admit("str", make_scope(), "1234"),
        lambda c: c.admit("bool", make_scope(), True),
        lambda c: c.release(["live"]),
        lambda c: c.cancel(None),
        lambda c: c.append(["live"], [1]),
        lambda c: c.reconcile("live"),
        lambda c: c.reconcile(None),
        lambda c: c.reconcile([1, 2]),
        lambda c: c.start_sweeper(float("nan")),
        lambda c: c.start_sweeper(float("inf")),
        lambda c: c.start_sweeper(0),
        lambda c: c.start_sweeper(-1),
        lambda c: c.start_sweeper(True),
        lambda c: c.start_sweeper("1"),
        lambda c: c.invalidate(model=123),
        lambda c: c.invalidate(model=""),
        lambda c: c.invalidate(),
    ],
    ids=[
        "negative-token",
        "float-tokens",
        "empty-seq-id",
        "priority-range",
        "not-a-scope",
        "duplicate",
        "unknown-seq",
        "token-too-big",
        "out-of-blocks",
        "nul-in-seq-id",
        "seq-id-too-long",
        "token-set",
        "token-dict",
        "token-str",
        "token-bool",
        "release-a-list",
        "cancel-none",
        "append-a-list",
        "reconcile-a-str",
        "reconcile-none",
        "reconcile-ints",
        "sweeper-nan",
        "sweeper-inf",
        "sweeper-zero",
        "sweeper-negative",
        "sweeper-bool",
        "sweeper-str",
        "invalidate-int",
        "invalidate-empty",
        "invalidate-nothing",
    ],
)
def test_bad_input_raises_typed_error_and_changes_nothing(
    make_cache: Factory, call: Callable[[GovernedKVCache], Any]
) -> None:
    """Every caller mistake gets a typed error and leaves the cache as it was."""
    cache = make_cache()
    cache.admit("live", make_scope(), PROMPT)
    before = _snapshot(cache)
    with pytest.raises(
        (
            InvalidTokens,
            InvalidArgument,
            InvalidScope,
            DuplicateSequence,
            UnknownSequence,
            OutOfBlocks,
        )
    ):
        call(cache)
    assert _snapshot(cache) == before
    assert cache._sweeper is None


def test_out_of_blocks_returns_the_prefix_references(make_cache: Factory) -> None:
    """A failed admission that had hit cached blocks gives their references back."""
    cache = make_cache(num_blocks=6)
    scope = make_scope()
    cache.admit("a", scope, PROMPT)
    cache.release("a")
    cache.admit("hold", make_scope(tenant="globex"), list(range(8)))
    with pytest.raises(OutOfBlocks):
        cache.admit("b", scope, PROMPT + list(range(500, 520)))
    cache.pool._check_invariants()
    assert cache.admit("c", scope, PROMPT).cached_tokens == 12


def test_missing_secret_refuses_to_start(make_cache: Factory, monkeypatch: Any) -> None:
    """With no secret and no ephemeral opt-in, creation fails with KeySecretError."""
    monkeypatch.delenv("KVGOV_KEY_SECRET", raising=False)
    with pytest.raises(KeySecretError):
        make_cache(key_secret=None)
    with pytest.raises(KeySecretError):
        make_cache(key_secret=b"short")


def test_secret_from_environment_and_ephemeral(make_cache: Factory, monkeypatch: Any) -> None:
    """KVGOV_KEY_SECRET is read; ephemeral_secret starts without one."""
    monkeypatch.setenv("KVGOV_KEY_SECRET", "e" * 40)
    assert make_cache(key_secret=None).admit("a", make_scope(), [1]).cached_tokens == 0
    monkeypatch.delenv("KVGOV_KEY_SECRET")
    assert make_cache(key_secret=None, ephemeral_secret=True).num_blocks == 32


def test_every_admission_and_reuse_is_audited(make_cache: Factory, audit_url: str) -> None:
    """Admissions, reuses (owner, requester, tokens, decision) and zeroizations reach the trail."""
    cache = make_cache()
    scope = make_scope()
    _hit_after_release(cache, scope, scope, PROMPT)
    admissions = _events(cache, audit_url, type="admission")
    assert len(admissions) == 2
    reuse = _events(cache, audit_url, type="reuse")
    assert len(reuse) == 1
    assert reuse[0].tenant == "acme" and reuse[0].requester_tenant == "acme"
    assert reuse[0].reused_tokens == 12
    zeroized = _events(cache, audit_url, type="zeroization")
    assert sum(len(e.block_ids) for e in zeroized) == cache.stats().total.blocks_zeroized > 0


def test_stats_count_per_tenant(make_cache: Factory) -> None:
    """Requests, queried and hit tokens, and blocks by state are counted per tenant."""
    cache = make_cache()
    _hit_after_release(cache, make_scope(), make_scope(), PROMPT)
    cache.admit("g", make_scope(tenant="globex"), PROMPT[:5])
    stats = cache.stats()
    acme = stats.tenants["acme"]
    assert (acme.requests, acme.queried_tokens, acme.hit_tokens) == (2, 26, 12)
    assert acme.prefill_tokens_avoided == 12
    assert acme.hit_rate == pytest.approx(12 / 26)
    assert stats.tenants["globex"].blocks_by_state["owned"] == 2
    assert acme.blocks_by_state["cached"] == 3
    assert stats.total.requests == 3
    assert sum(stats.total.blocks_by_state.values()) == stats.num_blocks
    assert stats.bytes_per_block == SPEC.bytes_per_block


def test_close_zeroizes_and_refuses_further_use(make_cache: Factory) -> None:
    """After close, the pool memory was zeroized and every call raises PoolClosed."""
    cache = make_cache()
    adm = cache.admit("a", make_scope(), PROMPT)
    fill(cache, adm.block_ids)
    view = cache.pool._tensor if hasattr(cache.pool, "_tensor") else None
    cache.close()
    if view is not None:
        assert not view.any()
    with pytest.raises(PoolClosed):
        cache.admit("b", make_scope(), PROMPT)
    cache.close()  # idempotent


def test_context_manager_closes(audit_url: str) -> None:
    """Leaving the with block closes the cache."""
    with GovernedKVCache.create(
        spec=SPEC, num_blocks=8, audit_url=audit_url, key_secret=SECRET
    ) as cache:
        cache.admit("a", make_scope(), PROMPT)
    with pytest.raises(PoolClosed):
        cache.admit("b", make_scope(), PROMPT)
