"""The governor's call sites build, fast, the very events AuditEvent would have built.

Every event the governor builds with ``trusted_event`` (admission, reuse, eviction,
zeroization) is built a second time here with every check of ``AuditEvent`` and
compared (``tests.support.trusted``), over a workload that reaches each site: a
tenant's own reuse, a public prefix shared across tenants, capacity evictions, an
adapter scope, a policy TTL, and a purge.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgov.audit import AuditEvent, AuditQueries
from kvgov.govern import GovernedKVCache
from tests.support.trusted import shadow_trusted_events

from .conftest import fill, make_scope, merged, share_group, tenant_config

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(200, 221))  # 21 tokens: 5 full blocks of 4 and one partial


def test_every_trusted_event_matches_the_checked_one(
    make_cache: Factory, audit_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = shadow_trusted_events(monkeypatch)
    cache = make_cache(
        num_blocks=16,
        policy_data=merged(
            share_group("sys", "bank", "clinic"),
            tenant_config("bank", retention_seconds={"internal": 90.5}),
        ),
    )
    lora = make_scope(tenant="bank", adapter="lora-ä", adapter_revision="3")
    for i in range(6):
        for tenant in ("bank", "clinic"):
            scope = lora if i % 3 == 2 and tenant == "bank" else make_scope(tenant=tenant)
            adm = cache.admit(f"{tenant}-{i}", scope, PROMPT if i < 3 else PROMPT[i:], priority=i)
            fill(cache, adm.block_ids)
            cache.release(f"{tenant}-{i}")
    adm = cache.admit("p", make_scope(tenant="bank"), PROMPT, public_prefix_tokens=8)
    fill(cache, adm.block_ids)
    cache.release("p")
    cache.admit("q", make_scope(tenant="clinic"), PROMPT, public_prefix_tokens=8)
    cache.release("q")
    cache.purge_tenant("clinic")
    cache.audit.flush()
    assert {"admission", "reuse", "eviction", "zeroization"} <= set(seen)
    with AuditQueries(audit_url) as trail:
        ttls = {e.details["ttl_seconds"] for e in trail.events(type="admission")}
    assert ttls == {90.5, 3600}  # the policy's TTLs: bank's, and clinic's default


def test_admissions_of_one_decision_share_one_details_mapping(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admission events whose details hold the same values share one mapping (the writer
    then encodes its JSON once); any value that differs gets a mapping of its own."""
    cache = make_cache(num_blocks=16)
    events: list[AuditEvent] = []
    real = cache.audit.record

    def record(event: AuditEvent) -> str:
        events.append(event)
        return real(event)

    monkeypatch.setattr(cache.audit, "record", record)
    for i, priority in enumerate([5, 5, 7]):
        cache.admit(
            f"r{i}", make_scope(tenant="bank"), list(range(100 * i, 100 * i + 9)), priority=priority
        )
        cache.release(f"r{i}")
    admissions = [e for e in events if e.type == "admission"]
    assert len(admissions) == 3
    assert admissions[0].details is admissions[1].details
    assert admissions[2].details is not admissions[0].details
    assert [e.details["requested_priority"] for e in admissions] == [5, 5, 7]
