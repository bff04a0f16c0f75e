"""An engine binding's plan (no tokens) is kept per scope while the policy's revision is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kvgov.govern import GovernedKVCache
from kvgov.govern.keys import pack_tokens

from .conftest import make_scope, tenant_config

Factory = Callable[..., GovernedKVCache]


def test_the_plan_is_kept_until_the_revision_changes(make_cache: Factory) -> None:
    cache = make_cache(policy_data=tenant_config("acme", retention_seconds={"internal": 10}))
    gov = cache.governor
    view = gov.admission_view(make_scope(), "s", 8)
    first = gov.plan(view, b"", True, 0)
    assert gov.plan(view, b"", True, 0) is first and first.ttl == 10
    other = gov.admission_view(make_scope(tenant="beta"), "s", 8)
    assert gov.plan(other, b"", True, 0) is not first
    # a new revision: the policy's new answer
    cache.reload_policy(policy_data=tenant_config("acme", retention_seconds={"internal": 20}))
    renewed = gov.plan(view, b"", True, 0)
    assert renewed is not first and renewed.ttl == 20
    # an admission's own plan (its tokens keyed here) is never kept
    packed = pack_tokens(range(8))
    assert gov.plan(view, packed, True, 0) is not gov.plan(view, packed, True, 0)
    assert not gov.plan(view, b"", False, 0).cacheable


def test_a_failed_decision_is_not_kept(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan that failed closed (a policy error) is asked again next time."""
    cache = make_cache()
    gov = cache.governor
    view = gov.admission_view(make_scope(), "s", 8)
    real = gov.policy.retention

    def failing(scope: Any) -> Any:
        answer = real(scope)
        return replace(answer, ttl_seconds=0, decision=replace(answer.decision, error="down"))

    monkeypatch.setattr(gov.policy, "retention", failing)
    failed = gov.plan(view, b"", True, 0)
    assert failed.failed and not failed.cacheable
    monkeypatch.setattr(gov.policy, "retention", real)
    assert gov.plan(view, b"", True, 0).cacheable
