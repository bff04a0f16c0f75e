"""A scope's admission is decided once per policy revision; every request is still
admitted, counted and audited on its own (needs SGLang).

The governed cache keeps the outcome of a scope's admission at a prompt length (view,
admission decision, namespaces and retention) under the policy revision it was made
under, and admits the scope's later requests from it. What must hold: every request
gets its own ``admission`` event and count; a policy reload, a purge and a refusal
take effect at the very next request; a namespace an erasure retires is never issued
again, to any scope that was admitted into it.
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

from kvgov.audit.queries import AuditQueries  # noqa: E402

from .test_differential import PAGE, _build, _req  # noqa: E402

PROMPT = array("q", range(1000, 1000 + 4 * PAGE))


def _events(cache: Any, url: str, kind: str) -> list[Any]:
    cache.kvgov.gov.audit.flush()
    with AuditQueries(url) as q:
        return list(q.events(type=kind))


def _counting_decisions(cache: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    gov = cache.kvgov.gov
    decide = gov.decide
    asked: list[str] = []

    def counting(view: Any, seq_id: str, *args: Any) -> Any:
        asked.append(seq_id)
        return decide(view, seq_id, *args)

    monkeypatch.setattr(gov, "decide", counting)
    return asked


def _data(**tenants: dict[str, Any]) -> dict[str, Any]:
    return {"kvgov": {"config": {"tenants": tenants}}}


def test_every_request_is_audited_though_its_scope_is_decided_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, _, _ = _build(True, tmp_path)
    try:
        asked = _counting_decisions(cache, monkeypatch)
        namespaces = {cache.kvgov_admit(_req(i, "acme", PROMPT)) for i in range(5)}
        assert asked == ["r0"]  # decided once for the scope and length
        assert len(namespaces) == 1
        cache.kvgov_admit(_req(5, "acme", PROMPT[:-PAGE]))  # another length: its own input
        assert asked == ["r0", "r5"]
        events = _events(cache, url, "admission")
        assert [e.sequence_id for e in events] == [f"r{i}" for i in range(6)]
        assert len({e.decision_id for e in events[:5]}) == 1  # the one decision, named
        assert {e.token_count for e in events} == {4 * PAGE, 3 * PAGE}
        assert cache.kvgov.gov.ledger.counters["acme"].requests == 6
    finally:
        cache.kvgov_close()


def test_a_policy_reload_takes_effect_at_the_next_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, _, _ = _build(True, tmp_path)
    try:
        ns = cache.kvgov_admit(_req(0, "acme", PROMPT))
        cache.kvgov.gov.policy.reload(None, _data(acme={"admission": False}))
        refused = _req(1, "acme", PROMPT)
        assert cache.kvgov_admit(refused) != ns  # a private namespace of its own
        assert refused._kvgov_admitted.view is None
        (denied,) = _events(cache, url, "policy_denied")
        assert denied.sequence_id == "r1" and "admission disabled" in denied.details["reason"]
        cache.kvgov.gov.policy.reload(None, _data())  # back: admitted, decided again
        assert cache.kvgov_admit(_req(2, "acme", PROMPT)) == ns
    finally:
        cache.kvgov_close()


def test_a_refusal_is_never_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, _, _ = _build(True, tmp_path)
    try:
        cache.kvgov.gov.policy.reload(None, _data(acme={"admission": False}))
        asked = _counting_decisions(cache, monkeypatch)
        for i in range(3):
            cache.kvgov_admit(_req(i, "acme", PROMPT))
        assert asked == ["r0", "r1", "r2"]
        assert [e.sequence_id for e in _events(cache, url, "policy_denied")] == ["r0", "r1", "r2"]
        assert not _events(cache, url, "admission")
    finally:
        cache.kvgov_close()


def test_a_tenant_being_purged_is_refused_though_decided_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, _, _ = _build(True, tmp_path)
    try:
        ledger = cache.kvgov.gov.ledger
        ns = cache.kvgov_admit(_req(0, "acme", PROMPT))
        ledger.purging.add("acme")
        refused = _req(1, "acme", PROMPT)
        assert cache.kvgov_admit(refused) != ns and refused._kvgov_admitted.scope is None
        assert [e.sequence_id for e in _events(cache, url, "policy_denied")] == ["r1"]
        ledger.purging.discard("acme")
        assert cache.kvgov_admit(_req(2, "acme", PROMPT)) == ns
    finally:
        cache.kvgov_close()


def test_a_retired_namespace_is_never_issued_again(tmp_path: Path) -> None:
    """Two tenants publishing in one share group share its namespace; a purge of either
    retires it, and neither is admitted into it again (each was registered in it)."""
    groups = {"pub": {"publishers": ["bank", "clinic"], "classifications": ["public"]}}
    environ = {"KVGOV_POLICY_DATA": json.dumps({"kvgov": {"config": {"share_groups": groups}}})}
    cache, _, _ = _build(True, tmp_path, environ)
    try:

        def admit(i: int, tenant: str) -> str:
            return str(cache.kvgov_admit(_req(i, tenant, PROMPT, kvgov_classification="public")))

        shared = admit(0, "bank")
        assert admit(1, "clinic") == shared and admit(2, "bank") == shared
        cache.kvgov.purge_tenant("clinic")
        after = admit(3, "bank")
        assert after != shared  # the next generation
        assert admit(4, "bank") == after  # kept again from there
        cache.kvgov.purge_tenant("bank")
        assert admit(5, "bank") not in (shared, after)
        assert admit(6, "clinic") not in (shared, after)
    finally:
        cache.kvgov_close()
