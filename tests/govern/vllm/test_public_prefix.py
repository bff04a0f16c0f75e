"""Public prefixes through vLLM's own scheduler: a system prompt shared across tenants
only where the sharing policy grants it, and never the conversation behind it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvgov.govern.keys import (
    KeyDeriver,
    continuation_root,
    namespace_root,
    pack_tokens,
    scope_digest,
)
from tests.govern.vllm.kv_specs import kv_specs

pytestmark = pytest.mark.vllm

PROMPT = list(range(100, 260))  # 160 tokens: 10 blocks of 16
PREFIX = 64  # the first 4 blocks are the public system prompt
OTHER = PROMPT[:PREFIX] + list(range(500, 596))  # the same system prompt, another question
GROUP = {"prompts": {"publishers": ["bank", "clinic"], "classifications": ["public"]}}
POLICY = {"policy_data": {"kvgov": {"config": {"share_groups": GROUP}}}}
PUBLIC_XARGS = {"kvgov_public_prefix_tokens": PREFIX}


def _req(vllm: Any, req_id: str, tenant: str, tokens: list[int] = PROMPT, **kw: Any) -> Any:
    return vllm.request(req_id, tokens, tenant=tenant, xargs=PUBLIC_XARGS, **kw)


def test_a_publisher_reuses_another_tenants_system_prompt_and_nothing_more(vllm: Any) -> None:
    """Same system prompt, same question, another tenant of the group: the prefix's 4
    blocks are reused, the (internal) rest is not; one audited cross-tenant reuse."""
    sched = vllm.scheduler(kvgov=POLICY)
    vllm.run(sched, _req(vllm, "a", "bank"))
    assert vllm.hit(sched, _req(vllm, "b", "clinic")) == PREFIX
    (event,) = vllm.events(sched, type="cross_tenant_reuse")
    assert (event.tenant, event.requester_tenant, event.reused_tokens) == ("bank", "clinic", PREFIX)
    assert event.classification == "public" and event.decision_id


def test_the_same_tenant_reuses_its_prefix_and_its_rest(vllm: Any) -> None:
    """Its own second request: every full block but the last (144 tokens), as without a prefix."""
    sched = vllm.scheduler(kvgov=POLICY)
    vllm.run(sched, _req(vllm, "a", "bank"))
    assert vllm.hit(sched, _req(vllm, "b", "bank")) == 144
    assert vllm.hit(sched, _req(vllm, "c", "bank", OTHER)) == PREFIX


def test_without_a_share_group_the_prefix_stays_the_tenants(vllm: Any) -> None:
    """The bundled policy grants no group: the public prefix is keyed in the tenant's own
    namespace, so another tenant finds nothing and the tenant itself everything."""
    sched = vllm.scheduler()
    vllm.run(sched, _req(vllm, "a", "bank"))
    assert vllm.hit(sched, _req(vllm, "b", "clinic")) == 0
    assert vllm.hit(sched, _req(vllm, "c", "bank")) == 144


def test_a_tenant_outside_the_group_finds_nothing(vllm: Any) -> None:
    sched = vllm.scheduler(kvgov=POLICY)
    vllm.run(sched, _req(vllm, "a", "bank"))
    assert vllm.hit(sched, _req(vllm, "b", "insurer")) == 0


def test_a_confidential_request_shares_its_public_prefix_only(vllm: Any) -> None:
    """The rest's classification does not matter to the prefix: keyed as public."""
    sched = vllm.scheduler(kvgov=POLICY)
    vllm.run(sched, _req(vllm, "a", "bank", classification="confidential"))
    assert vllm.hit(sched, _req(vllm, "b", "clinic", classification="confidential")) == PREFIX


def test_the_hashes_follow_kvgovs_public_prefix_layout(vllm: Any) -> None:
    """Blocks 0-3 under the public scope from the group's root, 4-9 under the request's
    scope from continuation_root(the tenant's root, key 3): the native cache's layout."""
    from kvgov.govern.vllm import fence

    from . import harness

    sched = vllm.scheduler(kvgov=POLICY)
    req = _req(vllm, "a", "bank")
    sched.add_request(req)
    scope = fence.governance_of(req).view.scope
    public = dataclasses.replace(scope, classification="public")
    deriver = KeyDeriver(harness.SECRET.encode())
    packed = pack_tokens(PROMPT)
    head = deriver.derive_chain(
        namespace_root("group", "prompts"), packed, scope_digest(public), 16, 4
    )
    tail = deriver.derive_chain(
        continuation_root(namespace_root("tenant", "bank"), head[-1]),
        packed,
        scope_digest(scope),
        16,
        6,
        first=4,
    )
    assert list(req.block_hashes) == head + tail


def test_the_prefix_blocks_are_owned_by_the_public_scope_with_its_retention(
    vllm: Any, clock: Any
) -> None:
    """4 cached blocks owned by the bank's public scope, kept for public's retention
    (86,400 s in the bundled policy); the other 6 by its internal scope, for 3,600 s."""
    sched = vllm.scheduler(kvgov=POLICY)
    vllm.run(sched, _req(vllm, "a", "bank"))
    ledger = sched.kvgov.gov.ledger
    pool = sched.kv_cache_manager.block_pool
    cached = [b.block_id for b in pool.blocks if b.block_hash is not None]
    by_label: dict[str, list[int]] = {}
    for b in cached:
        owner = ledger.owners.table[b]
        assert owner.tenant == "bank"
        by_label.setdefault(owner.classification, []).append(b)
    assert {k: len(v) for k, v in by_label.items()} == {"public": 4, "internal": 6}
    now = clock()
    assert {round(ledger.deadlines.deadline(b) - now) for b in by_label["public"]} == {86400}
    assert {round(ledger.deadlines.deadline(b) - now) for b in by_label["internal"]} == {3600}


def test_a_prefix_longer_than_the_prompt_is_refused(vllm: Any) -> None:
    sched = vllm.scheduler(kvgov=POLICY)
    req = vllm.request(
        "a", PROMPT, tenant="bank", xargs={"kvgov_public_prefix_tokens": len(PROMPT) + 1}
    )
    run = vllm.run(sched, req)
    assert "longer than the prompt" in str(run.finals["a"].stop_reason)
    (event,) = vllm.events(sched, type="policy_denied")
    assert "kvgov_public_prefix_tokens" in event.details["reason"]


@pytest.mark.parametrize("value", ["64", -1, 2**32, True, 6.4])
def test_a_malformed_prefix_is_refused(vllm: Any, value: Any) -> None:
    sched = vllm.scheduler(kvgov=POLICY)
    req = vllm.request("a", PROMPT, tenant="bank", xargs={"kvgov_public_prefix_tokens": value})
    run = vllm.run(sched, req)
    assert "kvgov_public_prefix_tokens" in str(run.finals["a"].stop_reason)


def test_a_hybrid_model_refuses_a_public_prefix(vllm: Any) -> None:
    """One chain per request is split at the prefix only for one KV cache group."""
    sched = vllm.scheduler(specs=kv_specs("full", "sliding"), kvgov=POLICY)
    run = vllm.run(sched, _req(vllm, "a", "bank"))
    assert "one KV cache group" in str(run.finals["a"].stop_reason)


def test_a_prefix_shorter_than_a_block_keys_everything_under_the_scope(vllm: Any) -> None:
    """No whole block is public: nothing is shared, and the tenant's own reuse is whole."""
    sched = vllm.scheduler(kvgov=POLICY)
    short = {"kvgov_public_prefix_tokens": 15}
    vllm.run(sched, vllm.request("a", PROMPT, tenant="bank", xargs=short))
    assert vllm.hit(sched, vllm.request("b", PROMPT, tenant="clinic", xargs=short)) == 0
    assert vllm.hit(sched, vllm.request("c", PROMPT, tenant="bank", xargs=short)) == 144


def test_a_purge_erases_the_public_blocks_the_tenant_wrote(vllm: Any) -> None:
    """The bank's system prompt blocks are the bank's: purging it zeroes all 10 of its
    blocks, and the clinic, which reused its prompt before, finds nothing after."""
    sched = vllm.scheduler(kvgov=POLICY)
    vllm.run(sched, _req(vllm, "a", "bank"))
    report = sched.kvgov_call("purge_tenant", "bank")
    assert report["blocks_zeroized"] == 10
    vllm.step(sched)  # the idle engine's step that carries the zeroing
    assert vllm.hit(sched, _req(vllm, "b", "clinic")) == 0
    (erasure,) = vllm.events(sched, type="erasure")
    assert erasure.tenant == "bank" and len(erasure.block_ids) == 10


@pytest.mark.parametrize(("config", "shared"), [(POLICY, True), ({}, False)])
def test_a_prefix_published_in_a_group_makes_the_request_a_share_group_ones(
    vllm: Any, config: dict[str, Any], shared: bool
) -> None:
    """Its hits are judged, and kvgov's fleet tier refuses it (``share_group``) as any
    share-group request; a prefix kept in the tenant's own namespace changes neither."""
    from kvgov.govern.vllm import fence

    sched = vllm.scheduler(kvgov=config)
    req = _req(vllm, "a", "bank")
    sched.add_request(req)
    state = fence.governance_of(req)
    assert state.prefix_blocks == PREFIX // 16
    assert state.shared is shared
