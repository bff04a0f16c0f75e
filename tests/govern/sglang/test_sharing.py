"""Share groups on SGLang's tree: a hit is judged per owning tenant, reuse audited (needs SGLang).

Two tenants that publish public prompts in one share group share a tree namespace,
so a hit there may hold pages of the other tenant. As in the vLLM binding, each
owner of another tenant is judged by the sharing policy and the hit cut at the
first refused page (``share_denied``); what is used is audited once per request
(``reuse``, ``cross_tenant_reuse`` naming the granting decision).
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

from kvgov.audit.queries import AuditQueries  # noqa: E402
from kvgov.audit.verify import verify  # noqa: E402

from .test_differential import PAGE, _build, _drive, _drive_checkpoint, _req  # noqa: E402


def _groups(*publishers: str) -> dict[str, Any]:
    group = {"pub": {"publishers": list(publishers), "classifications": ["public"]}}
    return {"kvgov": {"config": {"share_groups": group}}}


def _environ(*publishers: str) -> dict[str, str]:
    return {"KVGOV_POLICY_DATA": json.dumps(_groups(*publishers))}


def _public(i: int, tenant: str, toks: array) -> Any:
    return _req(i, tenant, toks, kvgov_classification="public")


def _match(cache: Any, req: Any) -> Any:
    toks = array("q", req.origin_input_ids)
    return cache.match_prefix(
        MatchPrefixParams(key=RadixKey(toks, None, limit=len(toks) - 1), req=req)
    )


def _events(cache: Any, url: str, kind: str) -> list[Any]:
    cache.kvgov.gov.audit.flush()
    with AuditQueries(url) as q:
        return list(q.events(type=kind))


def _prompt(start: int, n: int) -> array:
    return array("q", range(start, start + n))


def test_a_granted_owner_is_reused_and_audited_naming_both_tenants(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, alloc, kv = _build(True, tmp_path, _environ("bank", "clinic"))
    try:
        prompt = _prompt(1000, 20 * PAGE)
        _drive(cache, alloc, kv, [_public(0, "bank", prompt)])
        clinic = _public(1, "clinic", prompt)
        m = _match(cache, clinic)
        assert m.device_prefix_len == 19 * PAGE  # all but the last token: 19 full pages
        _match(cache, clinic)  # the scheduler matches a waiting request again
        (event,) = _events(cache, url, "cross_tenant_reuse")  # audited once per request
        assert (event.tenant, event.requester_tenant) == ("bank", "clinic")
        assert event.reused_tokens == 19 * PAGE and event.decision_id
        counters = cache.kvgov.gov.ledger.counters["clinic"]
        assert counters.cross_tenant_reuses == 1
        assert counters.hit_tokens == 19 * PAGE  # counted once, as the reuse is audited
        # the publisher's own next request: a reuse of its own pages, no decision
        _match(cache, _public(2, "bank", prompt))
        (own,) = _events(cache, url, "reuse")
        assert (own.tenant, own.requester_tenant, own.reused_tokens) == ("bank", "bank", 19 * PAGE)
        assert not _events(cache, url, "share_denied")
    finally:
        cache.kvgov_close()
    assert verify(url).ok


def test_a_refused_owner_cuts_the_hit_at_its_first_page(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, alloc, kv = _build(True, tmp_path, _environ("bank", "clinic"))
    try:
        head = _prompt(1000, 20 * PAGE)
        tail = head + _prompt(9000, 4 * PAGE)
        longer = tail + _prompt(20_000, 2 * PAGE)
        # as SGLang's scheduler inserts: through checkpoint(req), so each page added to
        # the group's namespace is the inserting request's
        _drive_checkpoint(cache, alloc, kv, [_public(0, "clinic", head)])  # clinic owns 20 pages
        _drive_checkpoint(cache, alloc, kv, [_public(1, "bank", tail)])  # bank reuses, adds 4
        owners = cache.kvgov.gov.ledger.owners
        assert len(owners.of_tenant("bank")) == 4 and len(owners.of_tenant("clinic")) == 20
        whole = _match(cache, _public(2, "clinic", longer))
        assert whole.device_prefix_len == 24 * PAGE  # granted: clinic may read bank's pages

        # bank leaves the group: its pages stay in the group's namespace, now refused
        cache.kvgov.gov.policy.reload(None, _groups("clinic"))
        clinic = _public(3, "clinic", longer)
        m = _match(cache, clinic)
        assert m.device_prefix_len == 20 * PAGE  # cut at bank's first page
        path = cache.path_device_indices(m.last_device_node)
        assert len(path) == 20 * PAGE  # the node SGLang locks ends where the cut is
        assert {int(p) // PAGE for p in path[::PAGE]} == set(owners.of_tenant("clinic"))
        (denied,) = _events(cache, url, "share_denied")
        assert (denied.tenant, denied.requester_tenant) == ("bank", "clinic")
        assert cache.kvgov.gov.ledger.counters["clinic"].cross_tenant_denied == 1
        lock = cache.lock(m.last_device_node)  # the cut hit is usable as SGLang's own
        cache.unlock(lock)
    finally:
        cache.kvgov_close()
    assert verify(url).ok


def test_outside_a_share_group_a_tenant_only_meets_its_own_pages(tmp_path: Path) -> None:
    """Confidential prompts of the group's tenants stay in each tenant's own namespace."""
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, alloc, kv = _build(True, tmp_path, _environ("bank", "clinic"))
    try:
        prompt = _prompt(1000, 20 * PAGE)
        _drive(cache, alloc, kv, [_req(0, "bank", prompt)])  # internal (the default)
        assert _match(cache, _req(1, "clinic", prompt)).device_prefix_len == 0
        assert _match(cache, _req(2, "bank", prompt)).device_prefix_len == 19 * PAGE
        assert not _events(cache, url, "cross_tenant_reuse")
        assert not _events(cache, url, "share_denied")
    finally:
        cache.kvgov_close()
