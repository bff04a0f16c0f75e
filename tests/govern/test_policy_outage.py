"""The policy engine down when the cache is created: admissions fail closed, audited,
and recover when the engine answers again (issue: an empty classification list stuck)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kvgov.audit import AuditQueries
from kvgov.exceptions import PolicyDenied
from kvgov.govern import GovernedKVCache
from kvgov.policy import Decision, OpaServerEngine, RetentionDecision, ShareGroups
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import new_decision_id
from tests.policy.opa_fake import FakeOpa

from .conftest import make_scope

Factory = Callable[..., GovernedKVCache]


@pytest.fixture()
def opa() -> Iterator[FakeOpa]:
    server = FakeOpa(EmbeddedEngine())
    yield server
    server.close()


def test_engine_down_at_start_denies_audited_then_recovers(
    make_cache: Factory, opa: FakeOpa, audit_url: str
) -> None:
    """Created while OPA errors: admissions are PolicyDenied and audited; then they work."""
    opa.mode = "error500"
    cache = make_cache(policy_engine=OpaServerEngine(opa.url, timeout=2.0))
    with pytest.raises(PolicyDenied) as info:
        cache.admit("s1", make_scope(), list(range(9)))
    assert "classifications" in info.value.reason
    cache.audit.flush()
    errors = list(AuditQueries(audit_url).events(type="policy_error"))
    assert [e.sequence_id for e in errors] == ["s1"]
    assert cache.stats().tenants["acme"].denials == {"policy_error": 1}
    opa.mode = "ok"
    adm = cache.admit("s2", make_scope(), list(range(9)))
    assert len(adm.block_ids) == 3


def _failed(path: str) -> Decision:
    return Decision(
        path=path,
        result=None,
        allow=False,
        reason="engine error",
        decision_id=new_decision_id(),
        bundle_revision="rev",
        engine="test",
        seconds=0.0,
        error="connection refused",
    )


def test_a_failed_retention_or_share_group_decision_is_audited(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch, audit_url: str
) -> None:
    """Retention and share groups fail closed (nothing cached) and each failure is audited."""
    cache = make_cache()
    policy = cache.policy
    monkeypatch.setattr(
        policy,
        "retention",
        lambda scope: RetentionDecision(0.0, _failed("kvgov/retention/ttl_seconds")),
    )
    monkeypatch.setattr(
        policy,
        "share_groups",
        lambda scope: ShareGroups(None, (), _failed("kvgov/sharing/groups")),
    )
    adm = cache.admit("s", make_scope(), list(range(9)))
    assert adm.cacheable is False
    cache.audit.flush()
    errors = AuditQueries(audit_url).events(type="policy_error")
    assert sorted(e.details["path"] for e in errors) == [
        "kvgov/retention/ttl_seconds",
        "kvgov/sharing/groups",
    ]
    assert all(e.tenant == "acme" and e.details["reason"] == "connection refused" for e in errors)
