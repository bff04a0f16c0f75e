"""kvgov's isolation suite through vLLM's own scheduler: the native cache's scenarios."""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.govern.keys import KeyDeriver, namespace_root, pack_tokens, scope_digest

from ..test_cache import SCOPE_CHANGES

pytestmark = pytest.mark.vllm

PROMPT = list(range(100, 260))  # 160 tokens: 10 blocks of 16; a resend may reuse 9 (144 tokens)
FULL_HIT = 144
#: Scope fields a request carries (the rest come from the engine or the adapter).
REQUEST_FIELDS = {
    "tenant": "tenant",
    "classification": "classification",
    "template_version": "template",
}


def _first_and_second(vllm: Any, sched: Any, first: dict[str, Any], second: dict[str, Any]) -> int:
    vllm.run(sched, vllm.request("first", PROMPT, **first))
    return vllm.hit(sched, vllm.request("second", PROMPT, **second))


def test_same_scope_reuses_the_prefix(vllm: Any) -> None:
    """A second identical prompt in the same scope reuses every full block but the last."""
    sched = vllm.scheduler()
    assert _first_and_second(vllm, sched, {}, {}) == FULL_HIT


def test_stock_vllm_leaks_across_tenants(vllm: Any) -> None:
    """The control: vLLM's own scheduler serves one tenant's KV to another."""
    sched = vllm.stock()
    assert _first_and_second(vllm, sched, {"tenant": "acme"}, {"tenant": "globex"}) == FULL_HIT


@pytest.mark.parametrize("change", SCOPE_CHANGES, ids=lambda c: ",".join(c))
def test_no_hit_across_any_scope_field(vllm: Any, change: dict[str, str]) -> None:
    """The native suite's scope changes: nothing is reused across any of them."""
    if set(change) <= set(REQUEST_FIELDS):
        sched = vllm.scheduler()
        second = {REQUEST_FIELDS[k]: v for k, v in change.items()}
        assert _first_and_second(vllm, sched, {}, second) == 0
    elif "adapter" in change:
        sched = vllm.scheduler(lora=True)
        lora = (change["adapter"], change["adapter_revision"])
        assert _first_and_second(vllm, sched, {}, {"lora": lora}) == 0
    else:
        # the model, the tokenizer and their revisions are the engine's: two engines
        # key the same prompt of the same tenant apart, so no cache could serve both
        one = vllm.scheduler()
        two = vllm.scheduler(**_engine_change(vllm, change))
        a, b = vllm.request("a", PROMPT), vllm.request("b", PROMPT)
        one.add_request(a)
        two.add_request(b)
        assert len(a.block_hashes) == len(b.block_hashes) == 10
        assert not set(a.block_hashes) & set(b.block_hashes)


def _engine_change(vllm: Any, change: dict[str, str]) -> dict[str, Any]:
    (name,) = change
    if name in ("model_revision", "tokenizer_revision"):
        return {"kvgov": {name: change[name]}}
    if name == "model":
        return {"model_dir": vllm.copy_model(change[name])}
    return {"tokenizer": vllm.copy_model(change[name])}


def test_no_hit_across_adapter_revisions(vllm: Any) -> None:
    """One LoRA name re-pointed at another path is another adapter revision: no reuse."""
    sched = vllm.scheduler(lora=True)
    hit = _first_and_second(
        vllm, sched, {"lora": ("lora-fin", "/adapters/a1")}, {"lora": ("lora-fin", "/adapters/a2")}
    )
    assert hit == 0
    same = vllm.hit(sched, vllm.request("third", PROMPT, lora=("lora-fin", "/adapters/a1")))
    assert same == FULL_HIT


def test_no_hit_across_cache_salts(vllm: Any) -> None:
    """vLLM's cache_salt (block 0) still separates prompts, on top of the scope."""
    sched = vllm.scheduler()
    assert _first_and_second(vllm, sched, {"salt": "s1"}, {"salt": "s2"}) == 0
    assert vllm.hit(sched, vllm.request("third", PROMPT, salt="s1")) == FULL_HIT


def _hashes(vllm: Any, sched: Any, req_id: str, **fields: Any) -> list[bytes]:
    """A request's block hashes once admitted (multimodal requests need an encoder to run,
    which a text model's scheduler does not budget: their keys are compared instead)."""
    req = vllm.request(req_id, PROMPT, **fields)
    sched.add_request(req)
    return list(req.block_hashes)


def test_two_images_behind_the_same_placeholders_never_share(vllm: Any) -> None:
    """Same tokens, same tenant, different image identifiers: keyed apart from the image on."""
    sched = vllm.scheduler()
    a = _hashes(vllm, sched, "a", mm=[("img-aaaa", 16, 40)])
    b = _hashes(vllm, sched, "b", mm=[("img-bbbb", 16, 40)])
    again = _hashes(vllm, sched, "c", mm=[("img-aaaa", 16, 40)])
    assert a[0] == b[0]  # block 0 holds no image
    assert not set(a[1:]) & set(b[1:])
    assert again == a


def test_one_image_at_two_offsets_never_shares(vllm: Any) -> None:
    """The same image placed differently within the same tokens keys apart."""
    sched = vllm.scheduler()
    a = _hashes(vllm, sched, "a", mm=[("img", 16, 40)])
    b = _hashes(vllm, sched, "b", mm=[("img", 20, 40)])
    assert a[0] == b[0] and not set(a[1:]) & set(b[1:])


def test_keys_are_kvgovs_native_keys(vllm: Any) -> None:
    """A request without extra keys is keyed exactly as kvgov's own cache keys it."""
    sched = vllm.scheduler()
    req = vllm.request("a", PROMPT)
    sched.add_request(req)
    scope = req._kvgov.scope
    expected = KeyDeriver(b"k" * 40).derive_chain(
        namespace_root("tenant", "acme"), pack_tokens(PROMPT), scope_digest(scope), 16, 10
    )
    assert list(req.block_hashes) == expected
    assert scope.model_revision == "r1" and scope.template_version == "sys-v3"


def test_share_grant_hits_and_is_audited_naming_both_tenants(vllm: Any) -> None:
    """Two publishers of a public share group reuse each other's blocks, audited."""
    group = {"public-prompts": {"publishers": ["bank", "clinic"], "classifications": ["public"]}}
    sched = vllm.scheduler(kvgov={"policy_data": {"kvgov": {"config": {"share_groups": group}}}})
    bank = {"tenant": "bank", "classification": "public"}
    clinic = {"tenant": "clinic", "classification": "public"}
    assert _first_and_second(vllm, sched, bank, clinic) == FULL_HIT
    (event,) = vllm.events(sched, type="cross_tenant_reuse")
    assert (event.tenant, event.requester_tenant, event.reused_tokens) == ("bank", "clinic", 144)
    assert event.decision_id
    assert sched.kvgov_call("stats")["tenants"]["clinic"]["cross_tenant_reuses"] == 1


def test_a_share_group_never_opens_confidential_blocks(vllm: Any) -> None:
    """The group is for public data: the same tenants' confidential prompts stay apart."""
    group = {"g": {"publishers": ["bank", "clinic"], "classifications": ["public"]}}
    sched = vllm.scheduler(kvgov={"policy_data": {"kvgov": {"config": {"share_groups": group}}}})
    bank = {"tenant": "bank", "classification": "confidential"}
    clinic = {"tenant": "clinic", "classification": "confidential"}
    assert _first_and_second(vllm, sched, bank, clinic) == 0


def test_a_reader_that_does_not_publish_finds_nothing(vllm: Any) -> None:
    """A request reads only the namespace it publishes in (one chain per request): fail closed."""
    group = {"g": {"publishers": ["bank"], "readers": ["clinic"], "classifications": ["public"]}}
    sched = vllm.scheduler(kvgov={"policy_data": {"kvgov": {"config": {"share_groups": group}}}})
    bank = {"tenant": "bank", "classification": "public"}
    clinic = {"tenant": "clinic", "classification": "public"}
    assert _first_and_second(vllm, sched, bank, clinic) == 0


def test_restricted_data_is_never_cached(vllm: Any) -> None:
    """Restricted (retention 0 in the bundled policy): no hashes, so nothing kept or found."""
    sched = vllm.scheduler()
    restricted = {"classification": "restricted"}
    assert _first_and_second(vllm, sched, restricted, restricted) == 0
    pool = sched.kv_cache_manager.block_pool
    assert not any(b.block_hash is not None for b in pool.blocks)
